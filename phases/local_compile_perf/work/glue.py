"""Glue ops of a harness, each measured on its own and held against its ideal time.

The glue ops are the target's regions (``@local_compile`` functions), because a region is
the unit a fix changes. One eager forward runs with every region bound to a recorder
(through the region's own binding slot, the one ``apply_local_compile`` fills), which
keeps a copy of the arguments of each distinct call signature and counts the calls per
step. Each signature is then timed alone in eager, forward and forward+backward (backward
= the difference), and its ideal bytes are the kit's boundary bytes (inputs read once,
outputs written once; backward: output grads and saved inputs read, input grads written).
With ``regions`` set, the ops of those regions are timed through their compiled binding
(the stack's code as it runs), so the findings can hold a rewrite against its ideal. On CUDA
each op is also profiled for the device time of its kernels: an op timed alone waits on its
own launches, which a full step hides behind the GPU's queue. The matmul FLOPs of the eager
function are counted too: a region that holds GEMMs is not bounded by its bytes.
Worker entry: ``measure_glue_worker`` (GlueRequest -> GlueResponse).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict

from phases.kit.harness import HarnessRequest, TimingKnobs
from phases.local_compile_perf.work.best_known import BestKnown, measure_best_known


class GlueRequest(HarnessRequest):
    tokens: int
    timing: TimingKnobs
    """Warm-up and timed calls per glue op (no profile here)."""
    regions: tuple[str, ...] = ()
    """Regions bound while timing: their ops are timed compiled, every other op eager."""


class GlueOp(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    op: str
    """Region name, with "#i" when a region is called with several signatures."""
    region: str
    calls_per_step: int
    shapes: tuple[str, ...]
    fwd_ms: tuple[float, ...]
    """Per-call forward samples (ms)."""
    fwdbwd_ms: tuple[float, ...]
    """Per-call forward+backward samples (ms); empty when nothing needs a grad."""
    fwd_bytes: int
    bwd_bytes: int
    eager_bytes: dict[str, int]
    """What the eager ops really move, fwd and bwd (kit ideal.record_op_bytes)."""
    compiled: bool = False
    """True when the times are of the region's compiled binding (bytes are always the eager function's)."""
    device_ms: float | None = None
    """Device time of the op's kernels per call (fwd+bwd when it has a backward), from the profiler;
    None off CUDA."""
    device_glue_ms: float | None = None
    """Of ``device_ms``, the kernels the step's glue counts (not GEMM, not attention): what an op
    holding GEMMs spends on glue. None off CUDA."""
    gemm_flops: int = 0
    """Matmul FLOPs of one call of the eager function (fwd+bwd when it has a backward)."""
    best_known: BestKnown | None = None
    """The op's best-known kernel timed on the same arguments, or why it was not (work/best_known.py)."""


class EagerStep(BaseModel):
    """One eager fwd+bwd step of the whole harness, timed and profiled in the process that timed the ops."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    wall_ms: float
    """Median wall time per step."""
    kernel_ms: float
    """Profiled kernel (or host-op) time per step."""
    glue_ms: float
    """Of ``kernel_ms``, what the step's glue counts (not GEMM, not attention)."""


class GlueResponse(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    tokens: int
    device: str
    timer: str
    ops: tuple[GlueOp, ...]
    regions_found: tuple[str, ...]
    call_floor_ms: float | None = None
    """Median time of one compiled call that does almost nothing (a one-element add), fwd+bwd,
    when regions were bound: what a compiled call costs here whatever its bytes."""
    eager_step: EagerStep | None = None
    """The whole eager step in this process (asked for without regions): what the ops timed alone leave over."""
    provenance: dict[str, Any]


def _detach(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().clone().requires_grad_(value.requires_grad)
    return value


def _signature(args: tuple, kwargs: dict) -> tuple[str, ...]:
    import torch

    return tuple(f"{tuple(v.shape)}:{str(v.dtype).removeprefix('torch.')}" for v in (*args, *kwargs.values())
                 if isinstance(v, torch.Tensor))


def record_region_calls(slots: dict[str, Any], forward: Callable[[], Any]) -> dict[tuple, dict[str, Any]]:
    """Run ``forward`` with every region recording; (region, shapes) -> {args, kwargs, calls}."""
    seen: dict[tuple, dict[str, Any]] = {}

    def recorder(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            key = (name, _signature(args, kwargs))
            entry = seen.setdefault(key, {"args": tuple(map(_detach, args)),
                                          "kwargs": {k: _detach(v) for k, v in kwargs.items()}, "calls": 0})
            entry["calls"] += 1
            return fn(*args, **kwargs)
        return call

    for name, slot in slots.items():
        slot.compiled = recorder(name, slot.fn)
    try:
        forward()
    finally:
        for slot in slots.values():
            slot.compiled = None
    return seen


def _grad_step(fn: Callable[[], Any]) -> Callable[[], None] | None:
    """A fwd+bwd closure for ``fn`` with seeded output grads, or None when nothing needs a grad."""
    import torch
    from torch.utils._pytree import tree_leaves

    outs = [t for t in tree_leaves(fn()) if isinstance(t, torch.Tensor) and t.requires_grad]
    if not outs:
        return None
    gen = torch.Generator(device=outs[0].device).manual_seed(0)
    grads = [torch.randn(t.shape, generator=gen, device=t.device, dtype=t.dtype) for t in outs]

    def step() -> None:
        new = [t for t in tree_leaves(fn()) if isinstance(t, torch.Tensor) and t.requires_grad]
        torch.autograd.backward(new, grads)

    return step


def measure_glue_op(op: str, region: str, entry: dict[str, Any], slot: Any, *,
                    device: str, warmup: int, iters: int) -> GlueOp:
    """Time one recorded signature alone (its bound callable: compiled when the region is bound,
    else eager) and compute its boundary and eager bytes and GEMM FLOPs from the eager function."""
    from phases.kit.ideal import boundary_bytes, record_op_bytes, sum_bytes
    from phases.kit.profile import profile_kernels
    from phases.kit.timing import is_cuda, measure_step

    eager = functools.partial(slot.fn, **entry["kwargs"])
    timed = functools.partial(slot.compiled or slot.fn, **entry["kwargs"])
    args = entry["args"]
    fwd = measure_step(lambda: timed(*args), warmup=warmup, iters=iters, device=device)
    step = _grad_step(lambda: timed(*args))
    fwdbwd = measure_step(step, warmup=warmup, iters=iters, device=device).samples_ms if step else ()
    table = profile_kernels(step or (lambda: timed(*args)), steps=iters, device=device) if is_cuda(device) else None
    ideal = boundary_bytes(eager, *args)
    best = measure_best_known(region, slot.fn, args, entry["kwargs"], device=device, warmup=warmup, iters=iters,
                              grad_step=_grad_step)
    return GlueOp(op=op, region=region, calls_per_step=entry["calls"], shapes=_signature(args, entry["kwargs"]),
                  fwd_ms=fwd.samples_ms, fwdbwd_ms=fwdbwd, fwd_bytes=ideal["fwd"], bwd_bytes=ideal["bwd"],
                  eager_bytes=sum_bytes(record_op_bytes(eager, *args)), compiled=slot.compiled is not None,
                  device_ms=table.total_ms_per_step if table is not None else None,
                  device_glue_ms=table.glue_ms_per_step if table is not None else None,
                  gemm_flops=gemm_flops(eager, args, backward=step is not None),
                  best_known=best)


def gemm_flops(fn: Callable[..., Any], args: tuple, *, backward: bool) -> int:
    """Matmul FLOPs of one eager call of ``fn`` (and its backward), by torch's FLOP counter."""
    import torch
    from torch.utils._pytree import tree_leaves
    from torch.utils.flop_counter import FlopCounterMode

    fresh = tuple(_detach(a) for a in args)
    with FlopCounterMode(display=False) as counter, torch.set_grad_enabled(backward):
        outs = [t for t in tree_leaves(fn(*fresh)) if isinstance(t, torch.Tensor) and t.requires_grad]
        if outs:
            torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
    return int(counter.get_total_flops())


def measure_call_floor(*, device: str, warmup: int, iters: int) -> float:
    """fwd+bwd of a compiled one-element add: the per-call floor under which bytes do not matter."""
    import statistics

    import torch

    from phases.kit.timing import measure_step

    tiny = torch.compile(lambda x: x + 1, fullgraph=True)
    x = torch.ones(1, device=device, requires_grad=True)
    timing = measure_step(lambda: tiny(x).sum().backward(), warmup=warmup, iters=iters, device=device)
    return statistics.median(timing.samples_ms)


def measure_eager_step(step: Callable[[], Any], *, device: str, timing: TimingKnobs) -> EagerStep:
    """The whole step's wall (median of timed steps, after a warm-up) and its profiled kernel and glue time."""
    from phases.kit.profile import profile_kernels
    from phases.kit.timing import measure_step

    wall = measure_step(step, warmup=timing.warmup, iters=timing.iters, device=device).median_ms
    table = profile_kernels(step, steps=timing.profile_steps, device=device)
    return EagerStep(wall_ms=wall, kernel_ms=table.total_ms_per_step, glue_ms=table.glue_ms_per_step)


def measure_glue_worker(request: dict) -> dict:
    """Worker entry: GlueRequest -> GlueResponse (see the module docstring)."""
    from orchestrator.progress import Eta, report
    from phases.kit.graphs import find_region_slots
    from phases.kit.harness import load_harness, resolve_dtype, set_fp32_precision
    from phases.kit.provenance import collect_provenance

    req = GlueRequest.model_validate(request)
    harness = load_harness(req.harness)
    set_fp32_precision(harness.spec.fp32_precision)
    harness.bind_regions([])
    workload = harness.build(tokens=req.tokens, device=req.device, dtype=resolve_dtype("bf16"), seed=req.seed)
    slots = find_region_slots()
    report(f"recording calls of {len(slots)} region(s)")
    calls = record_region_calls(slots, workload.forward)
    # NOTE: first, so the process's one-time costs (autograd threads, allocator) fall on it and not on the first op.
    if not req.regions:
        report("timing and profiling the whole eager step")
    eager = None if req.regions else measure_eager_step(workload.step, device=req.device, timing=req.timing)
    harness.bind_regions(list(req.regions))
    ops, per_region = [], {}
    for (region, _shapes), entry in calls.items():
        per_region[region] = per_region.get(region, 0) + 1
    index: dict[str, int] = {}
    eta = Eta(len(calls))
    for (region, _shapes), entry in calls.items():
        index[region] = index.get(region, 0) + 1
        op = region if per_region[region] == 1 else f"{region}#{index[region]}"
        eta.report(f"timing glue op {op}")
        ops.append(measure_glue_op(op, region, entry, slots[region], device=req.device,
                                   warmup=req.timing.warmup, iters=req.timing.iters))
        eta.step_done()
    harness.bind_regions([])
    floor = measure_call_floor(device=req.device, warmup=req.timing.warmup, iters=req.timing.iters) \
        if req.regions else None
    return GlueResponse(
        tokens=req.tokens, device=req.device, timer="cuda_events" if req.device.startswith("cuda") else "host",
        ops=tuple(ops), regions_found=tuple(sorted(slots)), call_floor_ms=floor, eager_step=eager,
        provenance=collect_provenance(command=f"measure_glue_worker {req.model_dump_json()}", seed=req.seed,
                                      target=Path.cwd()),
    ).model_dump(mode="json")
