"""Step 1's attention check: the eager step's attention time against its FLOP floor, and the backend it used.

The worker counts the FLOPs (phases/kit/attention.py) and the GEMM rate they divide by; here each
eager cell becomes one row. Attention that is the step's largest family and far from its floor is, as
the skill says, a backend choice (flex, varlen, FA4, cuDNN) to report with the floor, not a region to
try. On CUDA a profile with no fused attention kernel means SDPA fell back to its math path: the
expected backend did not load. Engine side: no torch.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from phases.local_compile_perf.records import AttentionFloor, Cell

FAR_FROM_FLOOR = 2.0
"""The skill names no number for "far"; at 2x its FLOP floor, the kernel, not the glue, is the lever."""
FUSED_KERNEL = re.compile(r"flash|fmha|cudnn|efficient|cutlass", re.I)


def eager_cells_with_attention(rows: Sequence[Cell]) -> list[Cell]:
    return [r for r in rows if r.variant == "eager" and r.status == "measured" and r.attention
            and r.attention["calls"]]


def floor_rows(rows: Sequence[Cell], gemm_rate: dict[str, Any], *, cuda: bool) -> list[AttentionFloor]:
    """One row per eager cell whose step calls SDPA, at the measured ``gemm_rate`` (kit GemmRate)."""
    out = []
    for cell in eager_cells_with_attention(rows):
        count, families = cell.attention, {f["family"]: f["ms_per_step"] for f in cell.families}
        floor_ms = count["flops_fwdbwd"] / (gemm_rate["tflops"] * 1e12) * 1e3
        measured_ms = families.get("attention", 0.0)
        ratio = measured_ms / floor_ms if floor_ms else float("inf")
        largest = bool(families) and max(families, key=families.__getitem__) == "attention"
        kernels = tuple(count.get("kernels") or ())
        out.append(AttentionFloor(tokens=cell.tokens, calls=count["calls"], shapes=tuple(count["shapes"]),
                                  flops_fwdbwd=count["flops_fwdbwd"], floor_ms=floor_ms, measured_ms=measured_ms,
                                  ratio=ratio, largest=largest, kernels=kernels,
                                  note=_note(ratio, largest, kernels, cuda=cuda)))
    return out


def _note(ratio: float, largest: bool, kernels: tuple[str, ...], *, cuda: bool) -> str:
    parts = []
    if cuda and not any(FUSED_KERNEL.search(k) for k in kernels):
        parts.append("no fused attention kernel in the profile: SDPA ran its math path, the expected backend "
                     "did not load")
    if ratio < 1.0:
        parts.append("below its FLOP floor, which no kernel can be: the profile's attention family does not hold all "
                     "of attention's work (on a host the math path's matmuls count as gemm), so it bounds nothing here")
    elif ratio >= FAR_FROM_FLOOR and largest:
        parts.append(f"the step's largest family and {ratio:.1f}x its floor: a backend choice (flex, varlen, FA4, "
                     "cuDNN) to report with the floor, not a region to try")
    elif ratio >= FAR_FROM_FLOOR:
        parts.append(f"{ratio:.1f}x its floor, not the step's largest family")
    else:
        parts.append(f"within {FAR_FROM_FLOOR:g}x of its floor")
    return "; ".join(parts)


def describe(row: AttentionFloor) -> str:
    return (f"attention at {row.tokens} tokens: {row.measured_ms:.3f} ms/step vs FLOP floor {row.floor_ms:.3f} ms "
            f"({row.flops_fwdbwd / 1e9:.2f} GFLOP fwd+bwd, {row.calls} call(s)) -> {row.ratio:.1f}x; backend: "
            f"{', '.join(row.kernels) or 'no attention kernel in the profile'}; {row.note}")
