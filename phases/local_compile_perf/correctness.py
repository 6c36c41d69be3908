"""Step 8, correctness: the candidate's output and every grad vs the stack's eager, bf16 + fp32 + fp64.

The references come from the stack tip's checkout run eager (the code before the change),
saved to a file; the candidate runs in its own checkout with its regions, in the worker that
compares (seeded, same shapes; kit correctness): candidate vs eager at the same dtype
within ~1 bf16 ulp (rel L2) or within the tensor's noise band (how far eager moves when its
inputs move by one ulp, as the skill compares), and candidate vs an fp64 eager reference
whose error may not exceed eager's own by more than ~1 ulp. The candidate replays the reference's routing (kit
routing): otherwise near-tied tokens pick other experts and MoE grads differ by O(1) for a
reason no rewrite caused. Every tensor's numbers go to an artifact. Ops of the fp64
reference that ran below fp64 are listed (a ``.float()`` inside the model): the reference
is then partly fp32, and the table says so.

TP/EP: the build check at world 8 (TP8/EP8) on a fake process group (``tp_ep``: shapes per rank,
graphs per region, a zero-token rank; a build check, not numerics) runs in the graph-budget phase,
before any timing, and rejects there a candidate that breaks where the stack does not. Its verdict
is carried here, into the correctness record and table, with its findings (a zero-token recompile
within the graph budget, a failure the stack has too). PP and the recipe's AC mode are recorded as
not covered by this harness.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchestrator.phase_api import PhaseContext, PhaseResult
from phases.local_compile_perf.candidates import current, in_checkout, reject
from phases.local_compile_perf.devlog import log
from phases.local_compile_perf.records import Plan, TpEpVerdict
from phases.local_compile_perf.results import ScreenConfirm
from phases.local_compile_perf.tp_ep import brief
from phases.local_compile_perf.work.candidate_checks import CaptureRequest, CorrectnessRequest, SaveCaptureRequest
from phases.local_compile_perf.workers import CAPTURE, COMPARE

NOT_COVERED = {"pp": "not in the harness", "ac": "recipe AC mode is the harness's (re-timing under SAC not done)"}


def run(ctx: PhaseContext) -> PhaseResult:
    plan, cand = ctx.result("plan", Plan), current(ctx)
    ctx.plan(2)
    prepared = cand.prepared
    tokens = plan.correctness_tokens
    ref_file = Path(prepared.candidate_checkout).parent / f"{prepared.name}-reference.pt"
    reference = SaveCaptureRequest(harness=plan.harness, device=plan.device, tokens=tokens, tree="eager",
                                   dtypes=("bf16", "fp32", "fp64"), out=str(ref_file))
    candidate = CaptureRequest(harness=plan.harness, device=plan.device, tokens=tokens,
                               tree="regions:" + ",".join(prepared.tree_regions), dtypes=("bf16", "fp32"))
    # NOTE: the reference holds every grad in three dtypes (tens of GB at real dims); the trail
    # keeps the comparison, so the file goes as soon as it is made, also when a worker fails.
    try:
        ref = captured_reference(ctx, reference, checkout=prepared.stack_checkout)
        compare = CorrectnessRequest(candidate=candidate, reference=str(ref_file), downcasts=tuple(ref["downcasts"]))
        result = ctx.call(*in_checkout(prepared.candidate_checkout, COMPARE, compare),
                          label="capture candidate and compare").model_dump(mode="json")
    finally:
        ref_file.unlink(missing_ok=True)
        ref_file.with_suffix(".json").unlink(missing_ok=True)
    table = {**summarize(result), "routing_replayed": ref["routers"]}
    comparisons = [{**c, "ok": r["ok"]} for c, r in zip(result["comparisons"], table["comparisons"])]
    failed = [r for r in table["comparisons"] if not r["ok"]]
    tp_ep = build_checked(ctx, cand.id)
    table["artifact"] = ctx.write_artifact(f"correctness-{cand.id}.md", ctx.render(
        "correctness.md.j2", label=cand.label, candidate=cand.id, tokens=tokens, routers=ref["routers"],
        downcasts=table["reference_downcasts"], comparisons=comparisons,
        tp_ep=tp_ep.model_dump(mode="json") if tp_ep else None))
    for row in table["comparisons"]:
        log(ctx, f"correctness of {cand.label!r}: {row['label']}: worst {row['worst']} rel L2 "
                 f"{row['worst_rel_l2']:.3g} (tol {row['tolerance']:.3g}, {row['tensors']} tensors): "
                 f"{'ok' if row['ok'] else 'FAIL'}",
            kind="measurement")
    record = {"candidate": cand.id, "tokens": tokens, **table, "not_covered": NOT_COVERED, "tp_ep": brief(tp_ep)}
    ctx.add_record("correctness", record)
    # NOTE: its confirmed timing stays with the rejection: a fast but wrong rewrite is worth knowing.
    confirmed = [j.model_dump() for j in ctx.result("screen_confirm", ScreenConfirm).judged]
    if failed:
        worst = failed[0]
        return reject(ctx, cand, f"{worst['label']}: {worst['worst']} rel L2 {worst['worst_rel_l2']:.3g} > tol "
                           f"{worst['tolerance']:.3g}", numbers={**record, "confirmed": confirmed})
    status = tp_ep.check.status if tp_ep else "UNRUN"
    return PhaseResult(outcome="passed", summary=f"correctness: {len(table['comparisons'])} comparisons within tol; "
                                                 f"TP/EP build check {status}", data=record)


def captured_reference(ctx: PhaseContext, request: SaveCaptureRequest, *, checkout: str) -> dict[str, Any]:
    """The stack's eager captures (CAPTURE's answer), saved to ``request.out``.

    A correctness phase cut after this capture (a device call's limit) finds the file and its answer
    beside it when it reruns on the same machine, and compares against them instead of capturing again:
    the capture is seeded, and it is what the cut attempt would have compared against.
    """
    out = Path(request.out)
    answer_file = out.with_suffix(".json")
    if out.is_file() and answer_file.is_file():
        saved = json.loads(answer_file.read_text())
        if saved.get("request") == request.model_dump(mode="json"):
            log(ctx, f"correctness: the stack's reference capture of the attempt that was cut is read back "
                     f"({out.name}), not made again", kind="measurement")
            return saved["answer"]
    answer = ctx.call(*in_checkout(checkout, CAPTURE, request), label="capture stack").model_dump(mode="json")
    answer_file.write_text(json.dumps({"request": request.model_dump(mode="json"), "answer": answer}))
    return answer


def build_checked(ctx: PhaseContext, candidate: str) -> TpEpVerdict | None:
    """The graph-budget phase's TP/EP verdict on ``candidate`` (None where the run has none)."""
    return next((v for v in reversed(ctx.records(TpEpVerdict)) if v.candidate == candidate), None)


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Per comparison: ok, worst tensor and its rel L2; the fp64 reference's downcasts."""
    rows = []
    for comp in result["comparisons"]:
        diffs = comp["diffs"]
        # NOTE: inf/nan arrive as strings (canonical JSON has no NaN); float() reads both forms.
        worst = max(diffs, key=lambda d: float(d["rel_l2"]) if float(d["rel_l2"]) == float(d["rel_l2"])
                    else float("inf"))
        rows.append({"label": comp["label"], "tolerance": comp["tolerance"], "tensors": len(diffs),
                     "ok": bool(diffs) and all(d["within"] for d in diffs), "worst": worst["name"],
                     "worst_rel_l2": float(worst["rel_l2"]),
                     "failing": [d["name"] for d in diffs if not d["within"]][:8]})
    return {"comparisons": rows, "reference_downcasts": list(result["reference_downcasts"]),
            "reference_pure_fp64": not result["reference_downcasts"]}
