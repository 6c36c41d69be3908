"""Worker functions of the candidate phases: in-process screen, cross-checkout parity.

Each runs inside one checkout (``run_in_checkout`` puts the worker there first):

    screen_worker         candidate code with the stack's regions vs with the candidate's
                          regions added, interleaved in one process (ranking only)
    capture_worker        seeded fwd+bwd captures (output + every grad, CPU copies)
                          saved to a file, so two checkouts can be compared
    compare_worker        captures the candidate and compares it with the stack's eager
                          captures, bf16 and fp32, and both with the stack's fp64 eager
                          reference (kit correctness)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from phases.kit.harness import HarnessRequest

if TYPE_CHECKING:
    from phases.kit.correctness import DtypeCaptures


class ScreenRequest(HarnessRequest):
    base_regions: tuple[str, ...]
    candidate_regions: tuple[str, ...]
    tokens: int
    rounds: int = 3
    warmup: int = 2
    iters: int = 5


def screen_worker(request: dict) -> dict:
    """ScreenRequest -> kit ScreenResult dump with variants "base_regions" and "with_candidate"."""
    from phases.kit.harness import load_harness, resolve_dtype
    from phases.kit.screen import screen_variants

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


class CaptureRequest(HarnessRequest):
    tree: str
    dtypes: tuple[str, ...]
    """Any of bf16, fp32, fp64 (fp64 runs eager and is watched for downcasts)."""
    tokens: int


class SaveCaptureRequest(CaptureRequest):
    out: str
    """File the captures are saved to (torch.save)."""


def capture(req: CaptureRequest, replay: dict[str, dict] | None = None) -> DtypeCaptures:
    """``req.tree`` per dtype (fp64 runs eager): the reference, or a candidate replaying ``replay``."""
    from phases.kit.correctness import capture_dtypes
    from phases.kit.harness import build_tree_workload, load_harness, resolve_dtype

    harness = load_harness(req.harness)

    def build(name: str) -> Any:
        return build_tree_workload(harness, "eager" if name == "fp64" else req.tree, tokens=req.tokens,
                                   device=req.device, dtype=resolve_dtype(name), seed=req.seed)

    captures = capture_dtypes(build, req.dtypes, replay=replay, seed=req.seed)
    harness.bind_regions([])
    return captures


class CaptureAnswer(BaseModel):
    """Answer of ``capture_worker``: where the captures went and what they hold."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    file: str
    tensors: dict[str, int]
    """Captured tensors per dtype."""
    downcasts: list[str]
    """Ops of the fp64 capture whose results were not fp64."""
    routers: list[str]


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


class CorrectnessRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    candidate: CaptureRequest
    """The candidate tree's captures (bf16, fp32), made in this process."""
    reference: str
    """File of the stack's eager captures (bf16, fp32, fp64), from capture_worker."""
    downcasts: tuple[str, ...] = ()
    """Ops of the fp64 reference capture whose results were not fp64 (from capture_worker)."""
    tolerance: float | None = None


def compare_worker(request: dict) -> dict:
    """CorrectnessRequest -> kit Correctness dump (4 comparisons; downcasts of the fp64 reference).

    The candidate is captured here rather than saved: at real dims one capture file is
    tens of GB, and the reference is read memory-mapped."""
    import torch

    from phases.kit.correctness import BF16_ULP_REL_TOL, DtypeCaptures, compare_dtypes
    from phases.kit.records import Correctness

    req = CorrectnessRequest.model_validate(request)
    saved = torch.load(req.reference, mmap=True, weights_only=True)
    reference = DtypeCaptures(tensors={k: saved[k] for k in ("bf16", "fp32", "fp64")}, downcasts=req.downcasts,
                              routing=saved["routing"], bands=saved["bands"])
    candidate = capture(req.candidate, replay=reference.routing)
    comparisons = compare_dtypes(candidate.tensors, reference, names=("candidate", "stack eager"),
                                 tolerance=req.tolerance or BF16_ULP_REL_TOL)
    return Correctness(comparisons=comparisons, reference_dtype="float64", reference_downcasts=req.downcasts,
                       seed=req.candidate.seed).model_dump(mode="json")
