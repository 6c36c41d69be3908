"""Worker functions of the candidate phases: graph budget, in-process screen, cross-checkout parity.

Each runs inside one checkout (``run_in_checkout`` puts the worker there first):

    graph_budget_worker   the kit's count over every token count + a no_grad pass, with
                          per-region counts from the regions' own functions
    screen_worker         candidate code with the stack's regions vs with the candidate's
                          regions added, interleaved in one process (ranking only)
    capture_worker        seeded fwd+bwd captures (output + every grad, CPU copies)
                          saved to a file, so two checkouts can be compared
    compare_worker        captures the candidate and compares it with the stack's eager
                          captures, bf16 and fp32, and both with the stack's fp64 eager
                          reference (kit correctness)
"""

from __future__ import annotations

from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict


class BudgetRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    harness: str
    regions: tuple[str, ...]
    tokens: tuple[int, ...]
    device: str
    seed: int = 0


def graph_budget_worker(request: dict) -> dict:
    """BudgetRequest -> kit GraphCount dump, per region from the region functions' cache entries."""
    from phases.kit.graphs import build_shape_pass, count_graphs
    from phases.kit.measure_once import resolve_dtype
    from phases.local_compile_perf.harness import load_harness
    from phases.local_compile_perf.work.glue import find_region_slots

    req = BudgetRequest.model_validate(request)
    harness = load_harness(req.harness)
    harness.bind_regions(list(req.regions))
    functions = dict(getattr(harness, "region_functions", {}) or {})
    slots = find_region_slots()
    functions.update({n: slots[n].fn for n in req.regions if n not in functions and n in slots})
    run = build_shape_pass(harness, tokens=req.tokens, device=req.device, dtype=resolve_dtype("bf16"), seed=req.seed)
    count = count_graphs(run, functions={n: f for n, f in functions.items() if n in req.regions})
    harness.bind_regions([])
    return count.model_dump(mode="json")


class ScreenRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    harness: str
    base_regions: tuple[str, ...]
    candidate_regions: tuple[str, ...]
    tokens: int
    device: str
    rounds: int = 3
    warmup: int = 2
    iters: int = 5
    seed: int = 0


def screen_worker(request: dict) -> dict:
    """ScreenRequest -> kit ScreenResult dump with variants "base_regions" and "with_candidate"."""
    from phases.kit.measure_once import resolve_dtype
    from phases.kit.screen import screen_variants
    from phases.local_compile_perf.harness import load_harness

    req = ScreenRequest.model_validate(request)
    harness = load_harness(req.harness)
    dtype = resolve_dtype("bf16")

    def variant(regions: tuple[str, ...]) -> Any:
        harness.bind_regions(list(regions))
        workload = harness.build(tokens=req.tokens, device=req.device, dtype=dtype, seed=req.seed)

        def step() -> None:
            harness.bind_regions(list(regions))
            workload.step()
        return step

    variants = {"base_regions": variant(req.base_regions), "with_candidate": variant(req.candidate_regions)}
    result = screen_variants(variants, rounds=req.rounds, warmup=req.warmup, iters=req.iters, device=req.device)
    harness.bind_regions([])
    return result.model_dump(mode="json")


class CaptureRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    harness: str
    tree: str
    dtypes: tuple[str, ...]
    """Any of bf16, fp32, fp64 (fp64 runs eager and is watched for downcasts)."""
    tokens: int
    device: str
    seed: int = 0


class SaveCaptureRequest(CaptureRequest):
    out: str
    """File the captures are saved to (torch.save)."""


class Captures(NamedTuple):
    tensors: dict[str, dict]
    """{dtype: {tensor name: CPU copy}}."""
    downcasts: tuple[str, ...]
    routing: dict[str, dict]
    """{dtype: {router: expert ids}}."""
    bands: dict[str, dict[str, float]]
    """{dtype: {tensor name: noise band}}, for the reference's bf16 and fp32 only."""


def capture(req: CaptureRequest, replay: dict[str, dict] | None = None) -> Captures:
    """One seeded fwd+bwd per dtype, with its routing.

    Without ``replay`` (the reference) each dtype's routing is recorded, and fp64 replays
    fp32's (fp64 would pick its own experts for near-tied tokens, and then every grad
    downstream differs for a reason no candidate caused); bf16 and fp32 also run once more
    with their inputs moved by one ulp (same routing), which gives each tensor's noise band.
    With ``replay`` (the candidate) each dtype replays the reference's routing of that dtype.
    """
    from phases.kit.correctness import capture_routed, noise_bands, perturb_one_ulp
    from phases.kit.measure_once import build_tree_workload, resolve_dtype
    from phases.local_compile_perf.harness import load_harness

    harness = load_harness(req.harness)
    saved, downcasts, routing, bands = {}, (), {}, {}
    for name in req.dtypes:
        tree = "eager" if name == "fp64" else req.tree
        workload = build_tree_workload(harness, tree, tokens=req.tokens, device=req.device,
                                       dtype=resolve_dtype(name), seed=req.seed)
        if replay is not None:
            ids = replay.get(name)
        else:
            ids = routing.get("fp32") if name == "fp64" else None
        captured, found, chosen = capture_routed(workload, replay=ids, watch=name == "fp64")
        if name == "fp64":
            downcasts = found
        saved[name], routing[name] = captured.tensors, chosen
        if replay is None and name != "fp64":
            for i, x in enumerate(workload.inputs):
                perturb_one_ulp(x, seed=req.seed + 1 + i)
            bands[name] = noise_bands(captured, capture_routed(workload, replay=chosen)[0])
        del workload, captured
    harness.bind_regions([])
    return Captures(saved, tuple(downcasts), routing, bands)


def capture_worker(request: dict) -> dict:
    """SaveCaptureRequest -> {"file", "tensors", "downcasts", "routers"}; the captures go to ``out``.

    The file holds {dtype: tensors}, "routing": {dtype: {router: expert ids}} and "bands":
    {dtype: {tensor: noise band}}."""
    import torch

    req = SaveCaptureRequest.model_validate(request)
    saved, downcasts, routing, bands = capture(req)
    torch.save({**saved, "routing": routing, "bands": bands}, req.out)
    return {"file": req.out, "tensors": {k: len(v) for k, v in saved.items()}, "downcasts": list(downcasts),
            "routers": sorted(routing.get("fp32", {}))}


class CompareRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    candidate: CaptureRequest
    """The candidate tree's captures (bf16, fp32), made in this process."""
    reference: str
    """File of the stack's eager captures (bf16, fp32, fp64), from capture_worker."""
    downcasts: tuple[str, ...] = ()
    """Ops of the fp64 reference capture whose results were not fp64 (from capture_worker)."""
    tolerance: float | None = None


def compare_worker(request: dict) -> dict:
    """CompareRequest -> kit Correctness dump (4 comparisons; downcasts of the fp64 reference).

    The candidate is captured here rather than saved: at real dims one capture file is
    tens of GB, and the reference is read memory-mapped."""
    import torch

    from phases.kit.correctness import BF16_ULP_REL_TOL, Captured, compare_captures, compare_vs_fp64
    from phases.kit.records import Correctness

    req = CompareRequest.model_validate(request)
    tol = req.tolerance or BF16_ULP_REL_TOL
    ref = torch.load(req.reference, mmap=True, weights_only=True)
    cand = capture(req.candidate, replay=ref["routing"]).tensors
    fp64 = Captured(tensors=ref["fp64"], dtype="float64")
    comparisons = []
    for name in ("bf16", "fp32"):
        c, e = Captured(tensors=cand[name], dtype=name), Captured(tensors=ref[name], dtype=name)
        comparisons.append(compare_captures(c, e, label=f"{name} candidate vs {name} stack eager", tolerance=tol,
                                            bands=ref["bands"].get(name)))
        comparisons.append(compare_vs_fp64(c, e, fp64, label=f"{name} candidate vs fp64 stack eager "
                                                              f"(error not above {name} eager's + tol)", tolerance=tol))
    return Correctness(comparisons=tuple(comparisons), reference_dtype="float64",
                       reference_downcasts=req.downcasts, seed=req.candidate.seed).model_dump(mode="json")
