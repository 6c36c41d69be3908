"""Measurement traps (skill-rules B.13) checked on a real harness before any baseline.

Each check runs the harness's own code and reports pass or fail with its evidence:

    detached_inputs     inputs are leaves with requires_grad, and a step gives them a grad
    accumulating_grads  a second step leaves fresh grads equal to one step's, not 2x
    unseeded_state      two builds with one seed give bitwise equal params, buffers, inputs
    dtype_init          the bf16, fp32 and fp64 builds of one seed are one model (up to rounding):
                        correctness compares them, and seeded draws differ by dtype
    precision_mismatch  the harness's fp32_precision is the target trainer's, and build set it

The worker entry ``run_trap_checks`` loads the harness by reference in the target's
Python (cwd = target) and answers with every finding; the engine refuses to baseline a
harness with any failed finding.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

from phases.kit.correctness import rel_l2
from phases.kit.harness import Harness, HarnessRequest, HarnessSpec, load_harness
from phases.local_compile_perf.tree_adapter import resolve_target_fp32_precision

if TYPE_CHECKING:
    import torch

TrapCode = Literal["detached_inputs", "accumulating_grads", "unseeded_state", "dtype_init", "precision_mismatch"]
GRAD_REPEAT_RTOL = 1e-2
"""Relative L2 between two steps' grads above which a grad counts as not repeated."""
SAME_MODEL_RTOL = 2.0**-7
"""Relative L2 between two dtypes' builds of one tensor within which they are one model
(bf16 rounding alone is under 2**-9; two independent draws are about 1.4)."""
FINGERPRINT_VALUES = 256


class TrapFinding(BaseModel):
    model_config = ConfigDict(frozen=True)

    trap: TrapCode
    status: Literal["pass", "fail"]
    message: str
    """What was checked and, on failure, the culprit and where to fix it."""
    evidence: dict[str, float | int | str] = {}


class TrapRequest(HarnessRequest):
    tokens: int = 256


class TrapResponse(BaseModel):
    model_config = ConfigDict(frozen=True)

    spec: HarnessSpec
    findings: tuple[TrapFinding, ...]
    passed: bool
    torch_version: str


def _finding(trap: TrapCode, problems: list[str], ok_message: str, **evidence: float | int | str) -> TrapFinding:
    if problems:
        return TrapFinding(trap=trap, status="fail", message="; ".join(problems), evidence=evidence)
    return TrapFinding(trap=trap, status="pass", message=ok_message, evidence=evidence)


def check_detached_inputs(harness: Harness, *, tokens: int, device: str, dtype: "torch.dtype") -> TrapFinding:
    """Inputs must be grad-requiring leaves that receive a grad from one step."""
    workload = harness.build(tokens=tokens, device=device, dtype=dtype, seed=0)
    problems = [
        f"input {i} is_leaf={x.is_leaf} requires_grad={x.requires_grad}"
        for i, x in enumerate(workload.inputs) if not (x.is_leaf and x.requires_grad)
    ]
    harness.bind_regions([])
    workload.step()
    problems += [f"input {i} got no grad from step() (detached inside forward?)"
                 for i, x in enumerate(workload.inputs) if x.requires_grad and x.grad is None]
    if problems:
        problems.append(f"fix {harness.spec.name}'s build(): inputs as in training, randn(..., requires_grad=True)")
    return _finding("detached_inputs", problems, "inputs are leaves and receive grads", inputs=len(workload.inputs))


def check_accumulating_grads(harness: Harness, *, tokens: int, device: str, dtype: "torch.dtype") -> TrapFinding:
    """After two steps each grad is a new tensor equal to one step's grad (not the sum)."""
    workload = harness.build(tokens=tokens, device=device, dtype=dtype, seed=0)
    harness.bind_regions([])
    tensors = [*workload.layers.parameters(), *workload.inputs]
    workload.step()
    first = [t.grad for t in tensors]
    # NOTE: clones, since an accumulating step adds into these very tensors.
    first_values = [None if g is None else g.detach().clone() for g in first]
    workload.step()
    reused, worst = [], 0.0
    for index, (t, g1, v1) in enumerate(zip(tensors, first, first_values)):
        if v1 is None or t.grad is None:
            continue
        if t.grad is g1:
            reused.append(index)
        rel = float((t.grad.float() - v1.float()).norm() / v1.float().norm().clamp_min(1e-30))
        worst = max(worst, rel)
    problems = ([f"{len(reused)} tensor(s) kept the same grad object across steps (first: {reused[:5]})"]
                if reused else [])
    if worst > GRAD_REPEAT_RTOL:
        problems.append(f"second step's grads differ from the first by rel L2 {worst:.3g} (2x would be 1.0)")
    if problems:
        problems.append(f"fix {harness.spec.name}'s step(): set every grad to None before forward")
    with_grad = sum(g is not None for g in first)
    if with_grad == 0:
        problems.append("step() produced no grads at all")
    return _finding("accumulating_grads", problems, "grads are fresh each step",
                    max_rel_l2=worst, tensors_with_grad=with_grad)


def named_state(workload: object) -> dict[str, "torch.Tensor"]:
    """Every parameter, buffer and input, by name, as raw bytes on its device (bitwise comparable)."""
    import torch

    layers = workload.layers  # type: ignore[attr-defined]
    named = [*layers.named_parameters(), *layers.named_buffers()]
    named += [(f"input{i}", x) for i, x in enumerate(workload.inputs)]  # type: ignore[attr-defined]
    out = {}
    for name, t in named:
        data = t.detach().contiguous()
        data = torch.view_as_real(data) if data.is_complex() else data
        out[name] = data.reshape(-1).view(torch.uint8)
    return out


def differing(first: dict[str, "torch.Tensor"], other: dict[str, "torch.Tensor"]) -> list[str]:
    """Names whose bytes differ (or that one side lacks), compared where they live: no host copy, no hash."""
    import torch

    return sorted(n for n in first if n not in other or first[n].shape != other[n].shape
                  or not torch.equal(first[n], other[n]))


def check_unseeded_state(harness: Harness, *, tokens: int, device: str, dtype: "torch.dtype") -> TrapFinding:
    """Same seed twice -> bitwise equal state; another seed -> different state.

    NOTE: compared byte for byte on the device: at real dims a sha256 of each build's host copy took seconds
    of a device call for each of the three builds."""
    first = named_state(harness.build(tokens=tokens, device=device, dtype=dtype, seed=0))
    differ = differing(first, named_state(harness.build(tokens=tokens, device=device, dtype=dtype, seed=0)))
    same_as_other = not differing(first, named_state(harness.build(tokens=tokens, device=device, dtype=dtype,
                                                                   seed=1)))
    problems = []
    if differ:
        problems.append(f"{len(differ)} tensor(s) differ between two builds with seed 0: {differ[:5]}; "
                        "create them after torch.manual_seed(seed) (never torch.empty without init)")
    if same_as_other:
        problems.append("seed 0 and seed 1 build identical state: build() ignores its seed")
    return _finding("unseeded_state", problems, "state is a function of the seed", tensors=len(first))


def fingerprint(workload: object) -> dict[str, "torch.Tensor"]:
    """The first values of every parameter and input, in fp64 on the CPU, by name."""
    import torch

    layers = workload.layers  # type: ignore[attr-defined]
    named = [*layers.named_parameters(), *((f"input{i}", x) for i, x in enumerate(workload.inputs))]  # type: ignore[attr-defined]
    return {name: t.detach().flatten()[:FINGERPRINT_VALUES].to("cpu", torch.float64) for name, t in named}


def check_dtype_init(harness: Harness, *, tokens: int, device: str, dtype: "torch.dtype") -> TrapFinding:
    """One seed built in ``dtype`` (the timed one), fp32 and fp64 gives one model: correctness compares them."""
    import torch

    reference = fingerprint(harness.build(tokens=tokens, device=device, dtype=torch.float32, seed=0))
    problems, worst, fp64_note = [], 0.0, "built"
    for other_dtype in (dtype, torch.float64):
        name = str(other_dtype).removeprefix("torch.")
        try:
            other = fingerprint(harness.build(tokens=tokens, device=device, dtype=other_dtype, seed=0))
        except (RuntimeError, TypeError, NotImplementedError) as exc:
            if other_dtype is dtype:
                raise
            fp64_note = f"not built here ({str(exc).splitlines()[0][:120]})"
            continue
        differ = {}
        for tensor, values in reference.items():
            theirs = other.get(tensor)
            rel = float("inf") if theirs is None else rel_l2(theirs, values)
            worst = max(worst, rel)
            if rel > SAME_MODEL_RTOL:
                differ[tensor] = rel
        if differ:
            first, rel = next(iter(differ.items()))
            problems.append(f"{len(differ)} of {len(reference)} tensor(s) of the {name} build are another draw than "
                            f"the fp32 build's with seed 0 (e.g. {first}: rel L2 {rel:.3g}); the {name} correctness "
                            "captures would compare another model")
    if problems:
        problems.append(f"fix {harness.spec.name}'s build(): draw weights and inputs in fp32, then cast")
    timed = str(dtype).removeprefix("torch.")
    return _finding("dtype_init", problems,
                    f"{timed}, fp32 and fp64 builds of one seed are one model (fp64: {fp64_note})",
                    max_rel_l2=worst, fp64=fp64_note)


def check_precision(harness: Harness, *, target: Path, tokens: int, device: str, dtype: "torch.dtype") -> TrapFinding:
    """The harness's fp32 precision is the trainer's, and build() applies it."""
    import torch

    expected, source = resolve_target_fp32_precision(target)
    declared = harness.spec.fp32_precision
    torch.backends.cuda.matmul.fp32_precision = "none"
    harness.build(tokens=tokens, device=device, dtype=dtype, seed=0)
    applied = torch.backends.cuda.matmul.fp32_precision
    applied = "ieee" if applied == "none" else applied
    problems = []
    if expected is None:
        problems.append(f"target sets conflicting fp32 precisions ({source}); decide which trainer applies")
    elif declared != expected:
        problems.append(f"harness declares fp32_precision={declared!r} but the trainer sets {expected!r} ({source})")
    if applied != declared:
        problems.append(f"after build() torch.backends.cuda.matmul.fp32_precision is {applied!r}, not {declared!r}")
    if problems:
        problems.append(f"fix {harness.spec.name}'s spec/build()")
    return _finding("precision_mismatch", problems, f"fp32 precision {declared!r} matches the trainer",
                    declared=declared, applied=applied, trainer=str(expected), source=source)


def check_harness_traps(harness: Harness, *, tokens: int, device: str, target: Path | None = None) -> list[TrapFinding]:
    """Run every trap check on ``harness`` (bf16, as in timing) and return all findings.

    Args:
        harness: a loaded harness.
        tokens: packed tokens per build (small is enough: the traps are not shape bound).
        device: "cpu" or "cuda".
        target: the target tree, for the trainer's fp32 precision; default the cwd
            (a worker's cwd is the target).
    """
    import torch

    dtype = torch.bfloat16
    kwargs = dict(tokens=tokens, device=device, dtype=dtype)
    return [
        check_detached_inputs(harness, **kwargs),
        check_accumulating_grads(harness, **kwargs),
        check_unseeded_state(harness, **kwargs),
        check_dtype_init(harness, **kwargs),
        check_precision(harness, target=target or Path.cwd(), **kwargs),
    ]


def run_trap_checks(request: dict) -> dict:
    """Worker entry: ``TrapRequest`` in, ``TrapResponse`` out (as JSON-able dicts)."""
    import torch

    from orchestrator.progress import report

    req = TrapRequest.model_validate(request)
    report(f"loading harness {req.harness}")
    harness = load_harness(req.harness)
    report("checking measurement traps")
    findings = check_harness_traps(harness, tokens=req.tokens, device=req.device)
    return TrapResponse(
        spec=harness.spec,
        findings=tuple(findings),
        passed=all(f.status == "pass" for f in findings),
        torch_version=torch.__version__,
    ).model_dump(mode="json")
