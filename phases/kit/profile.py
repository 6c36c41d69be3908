"""Profiler kernel tables grouped by family (gemm, attention, glue families).

``profile_kernels`` profiles a few steps and returns one row per profiler key with the
count per step next to the time per step: ``key_averages`` merges every kernel of the
same name, so two 7 us scatters look like one 14 us entry unless the count is read too.
Self time is used (device self time on CUDA, self CPU time on CPU) so parents never count
their children twice. Families come from name rules, first match wins; Inductor prefixes
(``triton_poi_`` pointwise, ``triton_red_``/``triton_per_`` reduction) are checked before
the substring rules because a fused norm is named after all the ops it fuses. On a CPU
host the rows are host ops (aten::*), not kernels, and the table says so in ``note``.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Callable

from phases.kit.records import Family, FamilySummary, KernelRow, KernelTable
from phases.kit.timing import is_cuda, sync

# NOTE: attention comes before gemm because flash/fmha kernel names often contain "gemm";
# cudnn::fusion kernels (compute_dot_do_o, convert_dq_to_16bits) are cuDNN SDPA's backward.
FAMILY_RULES: tuple[tuple[Family, re.Pattern[str]], ...] = (
    ("pointwise", re.compile(r"^triton_poi_")),
    ("reduction", re.compile(r"^triton_(red|per)_")),
    ("attention", re.compile(r"flash|fmha|sdpa|scaled_dot_product|attention|flex_attn|_attn_|cudnn::fusion", re.I)),
    ("gemm", re.compile(r"gemm|cutlass|nvjet|xmma|cublas|wgmma|aten::(mm|addmm|bmm|baddbmm|matmul|linear|_grouped_mm)$"
                        r"|triton_tem_fused_(mm|addmm|bmm)", re.I)),
    ("sort", re.compile(r"sort|radix|topk|bitonic", re.I)),
    ("scatter/gather", re.compile(r"scatter|gather|index|embedding|masked_select|nonzero", re.I)),
    ("norm", re.compile(r"norm|rsqrt|RowwiseMoments", re.I)),
    ("cat/copy", re.compile(r"cat|copy|memcpy|memset|clone|contiguous|to_copy|fill|stack|transpose_|permute", re.I)),
    ("pointwise", re.compile(r"elementwise|pointwise", re.I)),
    ("reduction", re.compile(r"reduce|softmax|sum|mean|amax|amin|max|min|cumsum|prod|argm", re.I)),
    ("pointwise", re.compile(r"aten::(add|sub|mul|div|neg|exp|log|pow|silu|sigmoid|gelu|relu|tanh|where|clamp|sqrt"
                             r"|square|abs|sign|lt|gt|le|ge|eq|ne|logical|bitwise|threshold)|silu|sigmoid|gelu", re.I)),
)
_CPU_NOTE = "rows are host (CPU) ops timed by self CPU time, not device kernels: no CUDA device"
_CUDA_NOTE = "rows are device kernels timed by self device time"


def classify_kernel(name: str) -> Family:
    """Family of a kernel or op name by the first matching rule in FAMILY_RULES."""
    for family, pattern in FAMILY_RULES:
        if pattern.search(name):
            return family
    return "other"


def profile_kernels(step: Callable[[], object], *, steps: int = 5, device: str) -> KernelTable:
    """Profile ``steps`` calls of ``step`` (already warm) and tabulate per key.

    Args:
        step: one fwd+bwd, warmed up before (compiles must not be profiled).
        steps: profiled calls; every per-step number is divided by this.
        device: "cuda..." profiles device kernels; otherwise host ops.

    Returns:
        KernelTable sorted by time per step, with a family summary.
    """
    from torch.profiler import ProfilerActivity, profile

    cuda = is_cuda(device)
    activity = ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU
    sync(device)
    with profile(activities=[activity]) as prof:
        for _ in range(steps):
            step()
        sync(device)
    rows = [
        KernelRow(
            name=evt.key,
            family=classify_kernel(evt.key),
            count_per_step=evt.count / steps,
            us_per_step=_self_us(evt, cuda=cuda) / steps,
        )
        for evt in prof.key_averages()
        if _self_us(evt, cuda=cuda) > 0 and not evt.key.startswith(("ProfilerStep", "cuda"))
    ]
    rows.sort(key=lambda r: -r.us_per_step)
    return KernelTable(
        rows=tuple(rows),
        steps=steps,
        activity="cuda" if cuda else "cpu",
        note=_CUDA_NOTE if cuda else _CPU_NOTE,
        families=summarize_families(rows),
    )


def _self_us(evt: object, *, cuda: bool) -> float:
    """Self time of a key_averages entry in us (device self time on CUDA)."""
    if cuda:
        return float(getattr(evt, "self_device_time_total", 0.0))
    return float(getattr(evt, "self_cpu_time_total", 0.0))


def summarize_families(rows: list[KernelRow] | tuple[KernelRow, ...]) -> tuple[FamilySummary, ...]:
    """Per-family count and ms per step, largest first."""
    count: dict[str, float] = defaultdict(float)
    us: dict[str, float] = defaultdict(float)
    for row in rows:
        count[row.family] += row.count_per_step
        us[row.family] += row.us_per_step
    summary = [FamilySummary(family=f, count_per_step=count[f], ms_per_step=us[f] / 1e3) for f in us]
    return tuple(sorted(summary, key=lambda s: -s.ms_per_step))


def diff_tables(base: KernelTable, other: KernelTable) -> tuple[tuple[str, float, float], ...]:
    """Per-family ms per step (base, other) for families present in either table.

    The regions-vs-block diff is the glue a region could still take.
    """
    a = {f.family: f.ms_per_step for f in base.families}
    b = {f.family: f.ms_per_step for f in other.families}
    fams = sorted(set(a) | set(b), key=lambda f: -(a.get(f, 0.0) - b.get(f, 0.0)))
    return tuple((f, a.get(f, 0.0), b.get(f, 0.0)) for f in fams)
