"""Step 11, feed the skill back: what this run found that the skill does not say.

Items come from the trail, not from prose: notes of kind ``skill_feedback`` (the agent's),
compile failures and recompile limits hit by candidates (symptom, workaround, repro),
an fp64 reference that ran partly in fp32, and rows the harness could not produce. Each
item is written to ``skill_feedback.md`` and noted once as a ``skill_feedback`` entry.
"""

from __future__ import annotations

from orchestrator.phase_api import PhaseContext, PhaseResult
from phases.local_compile_perf.devlog import log, renders_devlog
from phases.local_compile_perf.records import Baselines


def collect_feedback(ctx: PhaseContext) -> list[dict[str, str]]:
    """Proposed additions to the skill, each {kind, text, repro}."""
    records = ctx.state["records"]
    items = [{"kind": "agent note", "text": n["text"], "repro": ""}
             for n in ctx.notes() if n["kind"] == "skill_feedback" and n["actor"] != "engine"]
    for verdict in records.get("candidate_verdict", []):
        if verdict["phase"] == "graph_budget":
            items.append({"kind": "compile limit" if not verdict["numbers"] or verdict["numbers"].get("limit_hit")
                          else "graph budget", "text": f"{verdict['label']}: {verdict['reason']}",
                          "repro": f"orchestrator candidate {ctx.run_id} --branch {verdict['branch']} --label ..."})
    downcasts = sorted({d for c in records.get("correctness", []) for d in c["reference_downcasts"]})
    if downcasts:
        items.append({"kind": "edge case", "repro": "",
                      "text": f"the fp64 reference is partly fp32 when the model upcasts with .float(): "
                              f"{len(downcasts)} op(s) such as {downcasts[0]}; the skill's 'no .float() inside' "
                              "check needs a dtype-following form (x.to(torch.promote_types(x.dtype, torch.float32)))"})
    rows = ctx.result("baselines", Baselines).rows if "baselines" in ctx.results else ()
    not_applicable = sorted({r.reason for r in rows if r.status == "not_applicable"})
    items += [{"kind": "harness gap", "text": reason, "repro": ""} for reason in not_applicable]
    return items


@renders_devlog
def run(ctx: PhaseContext) -> PhaseResult:
    items = collect_feedback(ctx)
    ctx.write_artifact("skill_feedback.md", ctx.render("feedback.md.j2", items=items, run_id=ctx.run_id))
    for item in items:
        if item["kind"] != "agent note":
            log(ctx, f"{item['kind']}: {item['text']}", kind="skill_feedback")
    return PhaseResult(outcome="passed", summary=f"skill feedback: {len(items)} proposed addition(s)",
                       data={"items": items})
