"""The proposed additions to the skill a run has gathered: the agent's notes and what the phases found.

Read by the findings phase (the doc's feedback section) and the feedback phase (skill_feedback.md).
"""

from __future__ import annotations

from orchestrator.phase_api import PhaseContext
from phases.local_compile_perf.records import Baselines
from phases.local_compile_perf.results import CandidateVerdict, CorrectnessRecord


def collect_feedback(ctx: PhaseContext) -> list[dict[str, str]]:
    """Proposed additions to the skill, each {kind, text, repro}."""
    items = [{"kind": "agent note", "text": n["text"], "repro": ""}
             for n in ctx.notes() if n["kind"] == "skill_feedback" and n["actor"] != "engine"]
    for verdict in ctx.records(CandidateVerdict):
        if verdict.phase == "graph_budget":
            kind = ("TP/EP build check" if "tp_ep" in verdict.numbers else
                    "compile limit" if not verdict.numbers or verdict.numbers.get("limit_hit") else "graph budget")
            items.append({"kind": kind, "text": f"{verdict.label}: {verdict.reason}",
                          "repro": f"orchestrator candidate {ctx.run_id} --branch {verdict.branch} --label ..."})
    downcasts = sorted({d for c in ctx.records(CorrectnessRecord) for d in c.reference_downcasts})
    if downcasts:
        items.append({"kind": "edge case", "repro": "",
                      "text": f"the fp64 reference is partly fp32 when the model upcasts with .float(): "
                              f"{len(downcasts)} op(s) such as {downcasts[0]}; the skill's 'no .float() inside' "
                              "check needs a dtype-following form (x.to(torch.promote_types(x.dtype, torch.float32)))"})
    rows = ctx.result("baselines", Baselines).rows if "baselines" in ctx.results else ()
    not_applicable = sorted({r.reason for r in rows if r.status == "not_applicable"})
    items += [{"kind": "harness gap", "text": reason, "repro": ""} for reason in not_applicable]
    return items
