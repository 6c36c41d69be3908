"""Step 11, feed the skill back: what this run found that the skill does not say.

Items come from the trail, not from prose: notes of kind ``skill_feedback`` (the agent's),
compile failures and recompile limits hit by candidates (symptom, workaround, repro),
an fp64 reference that ran partly in fp32, and rows the harness could not produce. Each
item is written to ``skill_feedback.md`` and noted once as a ``skill_feedback`` entry.
"""

from __future__ import annotations

from orchestrator.phase_api import PhaseContext, PhaseResult
from phases.local_compile_perf.devlog import log
from phases.local_compile_perf.skill_feedback import collect_feedback


def run(ctx: PhaseContext) -> PhaseResult:
    items = collect_feedback(ctx)
    ctx.write_artifact("skill_feedback.md", ctx.render("feedback.md.j2", items=items, run_id=ctx.run_id))
    for item in items:
        if item["kind"] != "agent note":
            log(ctx, f"{item['kind']}: {item['text']}", kind="skill_feedback")
    return PhaseResult(outcome="passed", summary=f"skill feedback: {len(items)} proposed addition(s)",
                       data={"items": items})
