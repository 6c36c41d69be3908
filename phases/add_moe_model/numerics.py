"""Phase 3a: numerical equivalence of the new model's synthetic config (skill A.3).

The phase sends the Phase 2 synthetic entry to one worker call that compares the
unmodified HF MoE block with the target's Titan MoE twice on the same weights: in
bf16 (the skill's verdict) and with both sides run in fp32 (a labelled diagnostic; the
dtype each side's matmuls really ran in is measured beside it, since torchtitan's experts
cast to bf16 whatever the run's dtype, and its reading says "agrees" only at KL PASS and
max_diff 0). One call, not two, because the torchtitan import dominates a synthetic
model's cost on CPU. Each row also says how firm its tier is (KL in float64, spread under
a one-ulp input change: work/firmness.py). The verdict decides the route: PASS -> "pass";
WARN, FAIL, or a PASS that the spread carries across 1e-6 (shown "PASS|WARN") -> "gap"
(Phase 3c is mandatory then); ERROR, SKIP or a failed state-dict round trip -> the skill's
triage as issues: needs_agent where the fix is the experiment folder's, needs_human where
it is not (transformers, torchtitan core, our synthetic entry: ``NOT_THE_AGENTS``), failed
where it is our own (``OURS``). Which codes go to the agent, and what each promises, is
declared in ``fixability_numerics``.

Where the target ships the skill's numerical_equivalence.py, that script runs too, for the
same model (``tree_scripts``): its verbatim output and parsed verdict sit beside ours, with
which verdict stands and why. When the kernel kills the two-dtype worker (Mixtral-sized
experts on a small machine), the bf16 verdict runs alone and the trail says so. A run started
with ``--weights DIR`` also runs the skill's pretrained test (Phase 3b) on that checkpoint
(``pretrained``), with the tree's own pretrained script where the target ships it.

Thresholds live in ``work/kl.py`` as our constants; nothing is read from the target.
Engine side: no torch import here or at import time of the worker module.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field

from orchestrator.errors import WorkerFailed
from orchestrator.phase_api import Issue, PhaseContext, PhaseResult
from phases.add_moe_model import pretrained, tree_scripts
from phases.add_moe_model.error_triage import NOT_THE_AGENTS, OURS, triage_error
from phases.add_moe_model.load_findings import check_load
from phases.add_moe_model.measured_tree import snapshot_experiment, with_snapshot
from phases.add_moe_model.memory_budget import memory_shortfall
from phases.add_moe_model.records import DIAGNOSTIC_DTYPE, Probe, Synthetic
from phases.add_moe_model.work.numerics import CompareRequest
from phases.add_moe_model.workers import NUMERICS, SEED
from phases.add_moe_model.tier_text import (diagnostic_reading, firmness_line, flip_text, reaches, split_text,
                                            tier_text)

VERDICT_DTYPE = "bfloat16"
# NOTE: a flag, not a verdict tier. On random-init synthetic weights the outputs are small,
# so one softmax over all 2x16xH elements is nearly flat and KL can pass a semantically
# different block (observed: gemma4_text KL 4.4e-08 with cos 0.949 in bf16 and fp32).
# Healthy models stayed above 0.99999 in the fp32 diagnostic on this CPU.
DIAGNOSTIC_COS_FLOOR = 0.9999
METRIC_UNITS = {"kl": "nats", "cos_sim": "ratio", "max_diff": "abs", "mean_diff": "abs"}
# The synthetic entry is built by the orchestrator (Phase 2) and the MoE site is found by its worker: no edit in
# the experiment folder gives the synthetic model an MoE layer, so a person decides.
NO_MOE_LAYER_FIX = ("orchestrator: phases/add_moe_model/work/scaled_config.py (the synthetic entry's layer rules: "
                    "first_k_dense_replace=0 / decoder_sparse_step=1 / mlp_layer_types=['sparse'] or more layers) or "
                    "phases/add_moe_model/work/moe_blocks.py (find_moe_site); or a person waives it: "
                    "`orchestrator resume RUN --waive no_moe_layer --reason TEXT`")


class NumericsTable(BaseModel):
    """What ``numerics_table.txt.j2`` renders."""

    device: str
    seed: int
    verdict_rows: list[Any]
    diagnostic_rows: list[Any] = Field(default_factory=list)
    diagnostic_dtype: str = DIAGNOSTIC_DTYPE
    diagnostic_readings: list[str] = Field(default_factory=list)
    """``tier_text.diagnostic_reading`` of each diagnostic row, in order."""
    firmness_rows: list[Any] = Field(default_factory=list)
    firmness_lines: list[str] = Field(default_factory=list)
    """``tier_text.firmness_line`` of each firmness row, in order."""
    all_passed: bool
    verdict_line: str = ""
    """The closing line, in the verdict's own words: PASS, WARN (gap analysis follows) or FAILED."""
    notes: list[str] = Field(default_factory=list)


def run(ctx: PhaseContext) -> PhaseResult:
    """Compare, write numerics.json + numerics.txt, record metrics, route on the bf16 verdict."""
    from phases.add_moe_model.work.numerics import CompareResult

    entry = resolve_synthetic_entry(ctx.result("synthetic_config", Synthetic) if "synthetic_config" in ctx.results
                                    else None)
    if isinstance(entry, Issue):  # the workflow's ordering, not the target: an error of ours
        return PhaseResult(outcome="failed", summary=entry.message, issues=(entry,))
    shortfall = memory_shortfall(entry) if ctx.options.get("device", "auto") != "cuda" else None
    if shortfall:
        return PhaseResult(outcome="failed", summary=shortfall, data={"code": "insufficient_memory"})
    measured = snapshot_experiment(ctx.target, ctx.base["commit"])
    request = build_request(entry, options=ctx.options)
    ctx.plan(planned_calls(ctx))
    ctx.progress(f"{request['model_type']} in {', '.join(request['dtypes'])}")
    answer = call_compare(ctx, request)
    results = [CompareResult.model_validate(r) for r in answer["results"]]
    ctx.write_artifact("numerics.json", json.dumps([r.model_dump() for r in results], indent=2, sort_keys=True))
    ctx.write_artifact("numerics.txt", ctx.render("numerics_table.txt.j2", table=build_table(results)))
    for result in results:
        record_metrics(ctx, result)
    probe = ctx.result("probe", Probe) if "probe" in ctx.results else None
    result = pretrained.attach(ctx, tree_scripts.attach(ctx, decide(results, probe=probe)))
    return with_snapshot(result, measured)


def planned_calls(ctx: PhaseContext) -> int:
    """The comparison, the tree's own script where the target ships it, and with ``--weights`` the pretrained test
    (and the tree's pretrained script)."""
    calls = 1 + (ctx.target / tree_scripts.NE_PATH).is_file()
    if ctx.options.get("weights"):
        calls += 1 + (ctx.target / pretrained.NEP_PATH).is_file()
    return calls


def call_compare(ctx: PhaseContext, request: dict[str, Any]) -> dict[str, Any]:
    """Both dtypes in one worker; when the kernel kills it (SIGKILL: memory), the bf16 verdict alone."""
    try:
        return ctx.call(NUMERICS, request, label="numerics").model_dump()
    except WorkerFailed as exc:
        if "(exit -9)" not in str(exc) or request["dtypes"] == [VERDICT_DTYPE]:
            raise
        killed = f"worker_finished seq {ctx.state['last_seq']}, log artifacts/{exc.log}"
    ctx.note(f"numerics worker was killed by SIGKILL (exit -9; {killed}) comparing {', '.join(request['dtypes'])}; "
             "what sent the signal is not recorded (the kernel's out-of-memory killer is one sender); the "
             f"{VERDICT_DTYPE} verdict runs alone, without the {DIAGNOSTIC_DTYPE} diagnostic", kind="finding")
    return ctx.call(NUMERICS, {**request, "dtypes": [VERDICT_DTYPE]}, label="numerics verdict only").model_dump()


def resolve_synthetic_entry(synthetic: Synthetic | None) -> dict[str, Any] | Issue:
    """The Phase 2 entry (config kwargs with model_type), or an Issue naming what is missing."""
    entry = synthetic.entry if synthetic else None
    if entry is None or "model_type" not in entry:
        return Issue(
            code="synthetic_config_missing",
            message="numerics: no synthetic entry with a model_type in results['synthetic_config']['entry']",
            fix_location="Phase 2 (synthetic_config) must complete first",
        )
    return entry


def build_request(entry: dict[str, Any], *, options: dict[str, Any]) -> dict[str, Any]:
    return CompareRequest(model_type=entry["model_type"], config_kwargs=entry, dtypes=[VERDICT_DTYPE, DIAGNOSTIC_DTYPE],
                          device=options.get("device", "auto"), seed=SEED).model_dump()


def build_table(results: list[Any]) -> NumericsTable:
    verdict = [r for r in results if r.dtype == VERDICT_DTYPE]
    diagnostic = [r for r in results if r.dtype != VERDICT_DTYPE]
    failed = any(r.status in ("FAIL", "ERROR") or r.roundtrip.status in ("FAIL", "ERROR") for r in verdict)
    notes = sorted({r.device_note for r in results if r.device_note})
    notes += [f"{r.model_type}: load_state_dict unexpected keys {r.load.unexpected}"
              for r in verdict if r.load.unexpected]
    notes += [f"{r.model_type}: load_state_dict missing keys {r.load.missing}" for r in verdict if r.load.missing]
    first, firm_rows = results[0], [r for r in results if r.firmness]
    return NumericsTable(device=first.device, seed=first.seed, verdict_rows=verdict,
                         diagnostic_rows=diagnostic, diagnostic_readings=[diagnostic_reading(r) for r in diagnostic],
                         firmness_rows=firm_rows,
                         firmness_lines=[firmness_line(r) for r in firm_rows],
                         all_passed=not failed, verdict_line=verdict_line(verdict), notes=notes)


def verdict_line(verdict: list[Any]) -> str:
    """One closing line that never says more than the rows above it."""
    failed = [r.model_type for r in verdict if r.status in ("FAIL", "ERROR") or r.roundtrip.status != "PASS"]
    if failed:
        return f"Some models FAILED ({', '.join(failed)}) — see above."
    dropped = [r.model_type for r in verdict if r.load.unexpected or r.load.missing]
    if dropped:
        return f"Not a valid comparison: load_state_dict dropped keys of {', '.join(dropped)} — see the finding."
    skipped = [r.model_type for r in verdict if r.status == "SKIP"]
    if skipped:
        return f"Not measured: {', '.join(skipped)} (SKIP) — no verdict, see the finding."
    warned = [r.model_type for r in verdict if r.status != "PASS" or (r.firmness or {}).get("edge")]
    if warned:
        return (f"No model failed; {', '.join(warned)} did not PASS outright (WARN, or a spread that reaches WARN): "
                "gap analysis follows.")
    return "All models passed numerical equivalence."


def record_metrics(ctx: PhaseContext, result: Any) -> None:
    role = "verdict" if result.dtype == VERDICT_DTYPE else "diagnostic"
    provenance = {"device": result.device, "device_note": result.device_note, "versions": result.versions,
                  "seed": result.seed, "worker": NUMERICS.ref, "dtype": result.dtype,
                  "hf_experts_impl": result.hf_experts_impl}
    for metric, unit in METRIC_UNITS.items():
        value = getattr(result, metric)
        if value is None:
            continue
        ctx.record_measurement(name=f"numerics_{metric}", unit=unit, samples=[value], provenance=provenance,
                               labels={"model_type": result.model_type, "dtype": result.dtype, "role": role})


def decide(results: list[Any], *, probe: Probe | None = None) -> PhaseResult:
    """Route on the bf16 result; the fp32 diagnostic never changes the outcome.

    ``probe`` is the probe phase's report: a finding about dropped keys quotes its strict-load verdict.
    """
    verdict = next(r for r in results if r.dtype == VERDICT_DTYPE)
    data = {"results": [r.model_dump() for r in results], "verdict": verdict.model_dump()}
    flags = flag_semantic_gap(results)
    data["diagnostic_flags"] = flags
    data["diagnostic_readings"] = [diagnostic_reading(r) for r in results if r.dtype != VERDICT_DTYPE]
    line = _summary_line(verdict) + "".join(f"; {f}" for f in flags)
    triaged = triage(verdict)
    issues = triaged + check_load(verdict, probe=probe)
    if any(i.code in OURS for i in issues):
        return PhaseResult(outcome="failed", summary=line, data=data, issues=tuple(issues))
    # NOTE: the route is also where a person's waiver of every finding sends the run: parallelism when the
    # triage says nothing was measured, else the tier's own route (a WARN or FAIL still needs its gap analysis).
    route, why = ("pass", None) if triaged else tier_route(verdict)
    if why:
        data["triage"] = why
    if issues:
        human = any(i.code in NOT_THE_AGENTS for i in issues)
        return PhaseResult(outcome="needs_human" if human else "needs_agent", summary=line, data=data,
                           issues=tuple(issues), route=route)
    return PhaseResult(outcome="passed", summary=line, data=data, route=route)


def tier_route(verdict: Any) -> tuple[str, str | None]:
    """("pass", None) for a firm PASS, else ("gap", why gap analysis is mandatory)."""
    edge = (verdict.firmness or {}).get("edge")
    if verdict.status == "PASS" and not edge:
        return "pass", None
    why = (f"{tier_text(verdict.status, verdict.firmness)}: the safe side is taken"
           if verdict.status == "PASS" else "numerical WARN/FAIL: look at routing or weight transfer")
    return "gap", why + " (gap analysis is mandatory)"


def flag_semantic_gap(results: list[Any]) -> list[str]:
    """Diagnostic runs whose cosine says "different function", whatever the KL tier says."""
    return [f"{r.dtype} diagnostic cos={r.cos_sim:.6f} < {DIAGNOSTIC_COS_FLOOR}: semantic difference suspected "
            "(activation, router scoring or scaling), not dtype noise"
            for r in results if r.dtype != VERDICT_DTYPE and r.cos_sim is not None and r.cos_sim < DIAGNOSTIC_COS_FLOOR]


def _summary_line(r: Any) -> str:
    if r.kl is None:
        return f"{r.status} {r.model_type} ({r.dtype}): {r.error or 'no metrics'}"
    firm = r.firmness or {}
    other_tiers = reaches(r.status, firm)
    reach = f" reaching {' and '.join(other_tiers)}" if other_tiers else ""
    other = (f", {firm['other_kernel']} experts {firm['kl_other_kernel']:.2e}"
             if firm.get("kl_other_kernel") is not None else "")
    tokens = split_text(firm) + flip_text(firm)
    extra = (f" (fp64 {firm['kl_fp64']:.2e}, one-ulp spread {firm['spread']:.2e}{reach}{other}{tokens})"
             if firm.get("spread") is not None else "")
    return (f"{r.status} {r.model_type} ({r.dtype}) KL={r.kl:.2e}{extra} cos={r.cos_sim:.6f} "
            f"max_diff={r.max_diff:.2e} round-trip={r.roundtrip.status}")


def triage(r: Any) -> list[Issue]:
    """The skill's failure triage for ERROR, SKIP and a failed round trip (empty otherwise; a round trip that
    did not run because the models could not be built is the row's error, not the adapter's)."""
    issues = []
    if r.roundtrip.status in ("FAIL", "ERROR"):
        issues.append(Issue(
            code="state_dict_roundtrip_failed",
            message=(f"{r.model_type}: round trip {r.roundtrip.status}: missing={r.roundtrip.missing} "
                     f"extra={r.roundtrip.extra} shape_mismatch={r.roundtrip.shape_mismatch} "
                     f"max_diff={r.roundtrip.max_diff} error={r.roundtrip.error}"),
            fix_location="state_dict_adapter.py (_build_hf_to_titan_patterns / _build_titan_to_hf_patterns)"))
    if r.status == "SKIP":
        issues.append(Issue(code="no_moe_layer", message=f"{r.model_type}: the synthetic model has no MoE layer",
                            fix_location=NO_MOE_LAYER_FIX))
    firmness_error = (r.firmness or {}).get("error")
    if firmness_error:
        issues.append(Issue(code="firmness_error", message=f"{r.model_type}: the firmness measurement raised "
                            f"{firmness_error}", fix_location="phases/add_moe_model/work/firmness.py (ours)"))
    if r.status == "ERROR":
        issues.append(triage_error(r.model_type, r.error_type or "", r.error or "", origin=r.error_origin,
                                   frame=r.error_frame))
    return issues
