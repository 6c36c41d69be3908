"""Numerical parity of a candidate tree against eager, in bf16 and fp32, plus an fp64 reference.

A capture runs one seeded fwd+bwd and keeps CPU copies, in their own dtype, of the output
and of EVERY grad (each parameter by name, each input), so nothing is judged on the output
alone; comparisons are computed in fp64. The loss is ``out.square().mean()`` computed in
fp32 for bf16/fp32 runs (as the training step does) and in fp64 for the fp64 reference: a
``.float()`` there would quietly make the reference an fp32 one, so the reference run is
also watched by a dispatch mode and every op whose floating result is not fp64 is reported
as a downcast. The builds of every dtype must be one model (the dtype_init trap). Candidate
vs eager at the same dtype must be within ~1 bf16 ulp (rel L2) or within the tensor's noise
band (how far eager moves when its inputs move by one ulp); against fp64, the candidate's
error may exceed eager's error by at most ~1 ulp. The candidate replays eager's routing.
Region binding is process-wide, so each side's binding is applied right before its own capture.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence

from phases.kit.records import Comparison, Correctness, TensorDiff

if TYPE_CHECKING:
    import torch

    from phases.kit.harness import Harness, Workload

BF16_ULP_REL_TOL = 2.0**-7
"""~1 bf16 ulp as a relative error: bf16 keeps 8 significant bits (7 stored + 1 implicit),
so neighbouring values near 1.0 differ by 2**-7 (0.0078125). A relative L2 gap at or under
this is within the rounding of a single bf16 value."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Captured:
    """CPU copies of one fwd+bwd in their own dtype: "output", "grad:<param name>", "grad:input<i>"."""

    tensors: dict[str, "torch.Tensor"]
    dtype: str


def _noop() -> None:
    return None


def capture_fwd_bwd(workload: "Workload") -> Captured:
    """Run one fwd+bwd (grads set to None first) and copy output and every grad to the CPU.

    Copies keep their dtype (lossless, and a quarter of fp64's bytes for bf16: the grads of
    real-dims layers run to tens of GB)."""
    import torch

    params = dict(workload.layers.named_parameters())
    for p in params.values():
        p.grad = None
    for x in workload.inputs:
        x.grad = None
    out = workload.forward()
    loss_dtype = torch.float64 if out.dtype == torch.float64 else torch.float32
    out.to(loss_dtype).square().mean().backward()
    tensors = {"output": out.detach().to("cpu", copy=True)}
    named = [*(("grad:" + n, p) for n, p in params.items()),
             *((f"grad:input{i}", x) for i, x in enumerate(workload.inputs))]
    for name, t in named:
        if t.grad is not None:
            tensors[name] = t.grad.detach().to("cpu", copy=True)
    return Captured(tensors=tensors, dtype=str(out.dtype).removeprefix("torch."))


def norms(a: "torch.Tensor", b: "torch.Tensor") -> tuple[float, float, float]:
    """(||a - b||, ||a||, ||b||) in fp64; the diff is inf when the shapes differ."""
    import torch

    a, b = a.to(torch.float64), b.to(torch.float64)
    norm_a, norm_b = torch.linalg.vector_norm(a).item(), torch.linalg.vector_norm(b).item()
    diff = torch.linalg.vector_norm(a - b).item() if a.shape == b.shape else float("inf")
    return diff, norm_a, norm_b


def rel_l2(a: "torch.Tensor", b: "torch.Tensor") -> float:
    """||a - b|| / ||b|| in fp64 (||a|| when b is all zeros, so an all-zero pair gives 0)."""
    diff, _, denom = norms(a, b)
    return _relative(diff, denom)


def _relative(diff: float, denom: float) -> float:
    return diff / denom if denom else diff


def compare_captures(candidate: Captured, reference: Captured, *, label: str, tolerance: float = BF16_ULP_REL_TOL,
                     bands: dict[str, float] | None = None) -> Comparison:
    """Rel L2 per tensor, with both norms; a tensor present on one side only is a failing row (inf).

    A tensor is within when its rel L2 is at most ``tolerance``, or at most its noise band:
    how far the reference itself moves when its inputs move by one ulp (``noise_bands``).
    """
    names = sorted(set(candidate.tensors) | set(reference.tensors))
    diffs = []
    for name in names:
        a, b = candidate.tensors.get(name), reference.tensors.get(name)
        if a is None or b is None:
            diffs.append(TensorDiff(name=name, rel_l2=float("inf"), within=False))
            continue
        diff, norm_a, norm_b = norms(a, b)
        err = _relative(diff, norm_b)
        band = (bands or {}).get(name)
        within = err <= tolerance or (band is not None and err <= band)
        diffs.append(TensorDiff(name=name, rel_l2=err, within=within, norm=norm_a, reference_norm=norm_b,
                                noise_band=band))
    return Comparison(label=label, tolerance=tolerance, diffs=tuple(diffs))


def perturb_one_ulp(t: "torch.Tensor", *, seed: int) -> None:
    """Move every element of ``t`` one ulp up or down (seeded signs), in place."""
    import torch

    up = (torch.rand(t.shape, generator=torch.Generator().manual_seed(seed)) < 0.5).to(t.device)
    with torch.no_grad():
        t.copy_(torch.where(up, torch.nextafter(t, torch.full_like(t, float("inf"))),
                            torch.nextafter(t, torch.full_like(t, float("-inf")))))


def noise_bands(base: Captured, perturbed: Captured) -> dict[str, float]:
    """Per tensor, rel L2 between a capture and the same run with its inputs moved by one ulp."""
    return {name: rel_l2(perturbed.tensors[name], t) for name, t in base.tensors.items() if name in perturbed.tensors}


def compare_vs_fp64(candidate: Captured, eager: Captured, fp64: Captured, *, label: str,
                    tolerance: float = BF16_ULP_REL_TOL) -> Comparison:
    """Candidate's error vs fp64 may exceed eager's error vs fp64 by at most ``tolerance``."""
    cand = compare_captures(candidate, fp64, label=label, tolerance=tolerance)
    base = {d.name: d.rel_l2 for d in compare_captures(eager, fp64, label=label, tolerance=tolerance).diffs}
    diffs = tuple(d.model_copy(update={"within": d.rel_l2 <= base.get(d.name, float("inf")) + tolerance,
                                       "eager_error": base.get(d.name)})
                  for d in cand.diffs)
    return cand.model_copy(update={"diffs": diffs})


def compare_to_reference(
    candidate_workload: "Workload",
    reference_workload: "Workload",
    *,
    bind_candidate: Callable[[], None] = _noop,
    bind_reference: Callable[[], None] = _noop,
    tolerance: float = BF16_ULP_REL_TOL,
    seed: int | None = None,
) -> Correctness:
    """Compare output and every grad of two workloads built from the same seed.

    Args:
        candidate_workload, reference_workload: built with identical seeds and shapes.
        bind_candidate, bind_reference: run right before each capture (region binding
            is process-wide, e.g. ``lambda: harness.bind_regions([])``).
        tolerance: rel L2 allowed per tensor.
        seed: the seed both were built with, for the record.

    Returns:
        Correctness with one comparison; an fp64 reference is also checked for downcasts.
    """
    bind_candidate()
    cand = capture_fwd_bwd(candidate_workload)
    bind_reference()
    ref, downcasts = capture_watching_dtype(reference_workload)
    label = f"{cand.dtype} candidate vs {ref.dtype} reference"
    return Correctness(
        comparisons=(compare_captures(cand, ref, label=label, tolerance=tolerance),),
        reference_dtype=ref.dtype,
        reference_downcasts=downcasts if ref.dtype == "float64" else (),
        seed=seed,
    )


def capture_watching_dtype(workload: "Workload") -> tuple[Captured, tuple[str, ...]]:
    """Capture, and name every op whose floating result differs from the output's dtype."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    expected = next(iter(workload.layers.parameters())).dtype
    allowed = {expected, torch.complex128} if expected == torch.float64 else {expected}
    seen: set[str] = set()

    class _DtypeWatch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()) and t.dtype not in allowed:
                    seen.add(f"{func} -> {str(t.dtype).removeprefix('torch.')}")
            return out

    with _DtypeWatch():
        captured = capture_fwd_bwd(workload)
    return captured, tuple(sorted(seen))


def capture_routed(
    workload: "Workload", *, replay: dict | None = None, watch: bool = False
) -> tuple[Captured, tuple[str, ...], dict]:
    """Capture (watching for downcasts when ``watch``) with ``replay``'s routing held, if any.

    Returns:
        (captured, downcasts, the expert ids each router chose), see kit routing.
    """
    from contextlib import nullcontext

    from phases.kit.routing import record_routing, replay_routing

    with replay_routing(workload.layers, replay) if replay else nullcontext(), \
            record_routing(workload.layers) as chosen:
        captured, downcasts = capture_watching_dtype(workload) if watch else (capture_fwd_bwd(workload), ())
    return captured, downcasts, chosen


class DtypeCaptures(NamedTuple):
    """One seeded fwd+bwd per dtype name ("bf16", "fp32", "fp64"), with its routing."""

    tensors: dict[str, dict[str, "torch.Tensor"]]
    """{dtype: {tensor name: CPU copy}}."""
    downcasts: tuple[str, ...]
    """Ops of the fp64 capture whose results were not fp64."""
    routing: dict[str, dict]
    """{dtype: {router: expert ids}}."""
    bands: dict[str, dict[str, float]]
    """{dtype: {tensor name: noise band}}, for a reference's bf16 and fp32."""


def capture_dtypes(build: Callable[[str], "Workload"], dtypes: Sequence[str], *, replay: dict[str, dict] | None = None,
                   seed: int = 0) -> DtypeCaptures:
    """Capture ``build(dtype)`` for each dtype name; the reference when ``replay`` is None.

    The reference records each dtype's routing, and fp64 replays fp32's (fp64 would pick its
    own experts for near-tied tokens, and every grad downstream would then differ for a reason
    no candidate caused); bf16 and fp32 run once more with their inputs moved by one ulp (same
    routing), which gives each tensor's noise band. A candidate (``replay`` given) replays the
    reference's routing of each dtype. fp64 is watched for downcasts.
    """
    tensors, downcasts, routing, bands = {}, (), {}, {}
    for name in dtypes:
        workload = build(name)
        ids = replay.get(name) if replay is not None else routing.get("fp32") if name == "fp64" else None
        captured, found, chosen = capture_routed(workload, replay=ids, watch=name == "fp64")
        if name == "fp64":
            downcasts = found
        tensors[name], routing[name] = captured.tensors, chosen
        if replay is None and name != "fp64":
            for i, x in enumerate(workload.inputs):
                perturb_one_ulp(x, seed=seed + 1 + i)
            bands[name] = noise_bands(captured, capture_routed(workload, replay=chosen)[0])
        del workload, captured  # NOTE: at real dims one workload's grads are GBs of device memory
    return DtypeCaptures(tensors, tuple(downcasts), routing, bands)


def compare_dtypes(candidate: dict[str, dict], reference: DtypeCaptures, *, names: tuple[str, str],
                   tolerance: float = BF16_ULP_REL_TOL) -> tuple[Comparison, ...]:
    """Per dtype of ``candidate``: vs the reference's same dtype (with its noise bands), and vs its fp64.

    ``names`` = (candidate, reference) as the labels say them, e.g. ("candidate", "stack eager").
    """
    fp64 = Captured(tensors=reference.tensors["fp64"], dtype="float64")
    cand_name, ref_name = names
    comparisons = []
    for name, tensors in candidate.items():
        c, e = Captured(tensors=tensors, dtype=name), Captured(tensors=reference.tensors[name], dtype=name)
        comparisons.append(compare_captures(c, e, label=f"{name} {cand_name} vs {name} {ref_name}", tolerance=tolerance,
                                            bands=reference.bands.get(name)))
        comparisons.append(compare_vs_fp64(c, e, fp64, tolerance=tolerance, label=f"{name} {cand_name} vs fp64 "
                                           f"{ref_name} (error not above {name} eager's + tol)"))
    return tuple(comparisons)


def check_correctness(
    harness: "Harness", *, candidate_tree: str, tokens: int, device: str, seed: int = 0, num_layers: int = 2
) -> Correctness:
    """Candidate tree vs eager in bf16 and fp32, and both vs an fp64 eager reference, in one process.

    The same captures and rules as the correctness phase (``capture_dtypes``, ``compare_dtypes``).

    Args:
        harness: the target's harness (regions are bound here, process-wide).
        candidate_tree: a measure_once tree name, e.g. "regions:rope,router" or "per_layer".
        tokens, device, seed, num_layers: the workload; the same seed for every build.

    Returns:
        Correctness: 2 same-dtype comparisons, 2 vs-fp64 comparisons, downcasts found in
        the fp64 reference.
    """
    from phases.kit.harness import build_tree_workload, resolve_dtype

    def builder(tree: str) -> Callable[[str], "Workload"]:
        return lambda name: build_tree_workload(harness, "eager" if name == "fp64" else tree, tokens=tokens,
                                                device=device, dtype=resolve_dtype(name), seed=seed,
                                                num_layers=num_layers)

    reference = capture_dtypes(builder("eager"), ("bf16", "fp32", "fp64"), seed=seed)
    candidate = capture_dtypes(builder(candidate_tree), ("bf16", "fp32"), replay=reference.routing, seed=seed)
    harness.bind_regions([])
    return Correctness(comparisons=compare_dtypes(candidate.tensors, reference, names=(candidate_tree, "eager")),
                       reference_dtype="float64", reference_downcasts=reference.downcasts, seed=seed)
