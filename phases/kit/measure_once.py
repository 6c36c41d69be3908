"""One measurement of one tree in this process: the unit a fresh-process confirmation runs.

``python -m phases.kit.measure_once --harness MOD:FN --tree eager|upstream|per_layer|regions:a,b
--tokens N --device D`` builds the harness's workload under the tree, times it (CUDA events
or host timer), profiles kernels, tries a whole-step CUDA-graph replay, and prints one line
``RESULT {json}`` with every sample, kernel time, peak memory and provenance. Any failure
raises and exits non-zero without a RESULT line, which confirm.py records as FAILED. The same
work is a worker function (``measure_tree_worker``, handle ``phases.kit.workers.MEASURE_TREE``).

Trees: eager = no region bound; upstream = the regions the target enables today; per_layer =
no region + ``torch.compile`` per block; regions:a,b = exactly those regions (a candidate,
after its branch is checked out).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from pydantic import BaseModel, ConfigDict

from phases.kit.harness import DTYPES, TREE_FORMS, HarnessRequest, HarnessSpec, TimingKnobs
from phases.kit.records import AttentionCount, KernelRow, KernelTable, NotApplicable, Timing

class MeasureRequest(HarnessRequest):
    """Worker input of ``measure_tree_worker`` (and the CLI's flags)."""

    tree: str
    tokens: int
    dtype: str = "bf16"
    num_layers: int = 2
    timing: TimingKnobs = TimingKnobs()
    cuda_graph: bool = True
    profile: bool = True
    """Profile kernels; without it the kernel table is empty and says why (a cold-compile run)."""
    ac_mode: str | None = None
    """Activation checkpointing of each layer: none, full or selective; None = the harness's recipe mode."""
    target: str = "."
    """Checkout whose commit goes into provenance."""
    command: str = ""


class MeasureResult(BaseModel):
    """Worker output: one tree at one token count; ``wall_ms`` is the median sample."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    harness: str
    spec: HarnessSpec
    tree: str
    regions: tuple[str, ...]
    per_layer_compile: bool
    tokens: int
    dtype: str
    ac_mode: str
    fp32_precision: str
    wall_ms: float
    timing: Timing
    kernel_ms: float
    kernel_count: float
    kernels: KernelTable
    cuda_graph: Timing | NotApplicable
    not_applicable: dict[str, str]
    """Rows that do not apply on this device, with the reason (empty on a GPU)."""
    provenance: dict
    attention: AttentionCount | None = None
    """The eager tree's attention FLOPs and backend (one more step, counted); None for compiled trees."""


def measure_tree(req: MeasureRequest) -> MeasureResult:
    """Build, time, profile and (on CUDA) replay one tree; see the module docstring."""
    from orchestrator.progress import report
    from phases.kit.cudagraph import measure_cuda_graph_replay
    from phases.kit.profile import profile_kernels
    from phases.kit.provenance import collect_provenance
    from phases.kit.timing import measure_step
    from phases.kit.harness import build_tree_workload, load_harness, resolve_dtype, resolve_tree, set_fp32_precision

    harness = load_harness(req.harness)
    set_fp32_precision(harness.spec.fp32_precision)
    report(f"building {req.harness} tree={req.tree} tokens={req.tokens} on {req.device}")
    ac_mode = req.ac_mode or harness.spec.ac_mode
    workload = build_tree_workload(harness, req.tree, tokens=req.tokens, device=req.device,
                                   dtype=resolve_dtype(req.dtype), seed=req.seed, num_layers=req.num_layers,
                                   ac_mode=ac_mode)
    knobs = req.timing
    report(f"timing {knobs.warmup} warm-up + {knobs.iters} steps")
    timing = measure_step(workload.step, warmup=knobs.warmup, iters=knobs.iters, device=req.device)
    if req.profile:
        report(f"profiling {knobs.profile_steps} steps")
        kernels = profile_kernels(workload.step, steps=knobs.profile_steps, device=req.device)
    else:
        kernels = KernelTable(rows=(), steps=0, activity="cuda" if req.device.startswith("cuda") else "cpu",
                              note="not profiled (a run that times its steps only)", families=())
    graph = (measure_cuda_graph_replay(workload.step, iters=knobs.iters, device=req.device)
             if req.cuda_graph else NotApplicable(reason="CUDA-graph replay not requested"))
    regions, per_layer = resolve_tree(harness.spec, req.tree)
    attention = _count_attention(workload.step, kernels) if req.tree == "eager" else None
    return MeasureResult(
        harness=req.harness, spec=harness.spec, tree=req.tree, regions=regions,
        per_layer_compile=per_layer, tokens=req.tokens, dtype=req.dtype,
        ac_mode=ac_mode, fp32_precision=harness.spec.fp32_precision,
        wall_ms=timing.median_ms, timing=timing,
        kernel_ms=kernels.total_ms_per_step, kernel_count=kernels.count_per_step,
        kernels=_top(kernels, 40), cuda_graph=graph,
        not_applicable=_not_applicable(timing=timing, kernels=kernels, graph=graph),
        provenance=collect_provenance(command=req.command or _argv(), seed=req.seed, target=Path(req.target)),
        attention=attention,
    )


def _count_attention(step: object, kernels: KernelTable) -> AttentionCount:
    from phases.kit.attention import count_attention

    names = tuple(dict.fromkeys(r.name.split("(")[0].removeprefix("void ") for r in kernels.rows
                                if r.family == "attention"))  # a CUDA kernel's name carries its whole signature
    return count_attention(step).model_copy(update={"kernels": names})


def _not_applicable(*, timing: Timing, kernels: KernelTable, graph: Timing | NotApplicable) -> dict[str, str]:
    rows = {"peak_memory": timing.peak_memory, "cuda_graph": graph}
    out = {name: row.reason for name, row in rows.items() if isinstance(row, NotApplicable)}
    if kernels.activity != "cuda" or not kernels.steps:
        out["kernel_time"] = kernels.note
    if timing.timer == "host":
        out["cuda_event_timing"] = "host timer (time.perf_counter) used: no CUDA device"
    return out


def _top(table: KernelTable, n: int) -> KernelTable:
    """Keep the n largest rows; the family summary still covers every row."""
    rows: tuple[KernelRow, ...] = table.rows[:n]
    return table.model_copy(update={"rows": rows})


def _argv() -> str:
    return " ".join([sys.executable, "-m", "phases.kit.measure_once", *sys.argv[1:]])


def measure_tree_worker(request: dict) -> dict:
    """Worker entry ``phases.kit.measure_once:measure_tree_worker``: MeasureRequest -> MeasureResult."""
    return measure_tree(MeasureRequest.model_validate(request)).model_dump(mode="json")


def parse_args(argv: Sequence[str]) -> MeasureRequest:
    p = argparse.ArgumentParser(prog="python -m phases.kit.measure_once", description=__doc__.splitlines()[0])
    p.add_argument("--harness", required=True, help="module.path:factory")
    p.add_argument("--tree", required=True, help=TREE_FORMS)
    p.add_argument("--tokens", required=True, type=int)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--seed", default=0, type=int)
    p.add_argument("--num-layers", default=2, type=int)
    p.add_argument("--warmup", default=5, type=int)
    p.add_argument("--iters", default=20, type=int)
    p.add_argument("--profile-steps", default=5, type=int)
    p.add_argument("--no-cuda-graph", action="store_true")
    p.add_argument("--target", default=".")
    a = p.parse_args(list(argv))
    return MeasureRequest(
        harness=a.harness, tree=a.tree, tokens=a.tokens, device=a.device, dtype=a.dtype, seed=a.seed,
        num_layers=a.num_layers, timing=TimingKnobs(warmup=a.warmup, iters=a.iters, profile_steps=a.profile_steps),
        cuda_graph=not a.no_cuda_graph, target=a.target, command=_argv(),
    )


def main(argv: Sequence[str] | None = None) -> None:
    result = measure_tree(parse_args(sys.argv[1:] if argv is None else argv))
    print("RESULT " + json.dumps(result.model_dump(mode="json"), sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
