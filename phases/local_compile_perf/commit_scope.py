"""Step 9, commit and scope: a validated candidate becomes the next stack branch.

The candidate's one commit (replayed on the stack tip) gets its regions enabled in the
recipe (the embedded trainer settings; never a shared default list) and becomes
``stack/<n>-<label>``, whose ancestry on the previous entry is checked with
``git merge-base --is-ancestor``. The scope check lists the files, any region named in a
shared default file (a violation: rejected), and the recipes that reach the change.
"""

from __future__ import annotations

from pathlib import Path
from orchestrator.phase_api import PhaseContext, PhaseResult
from phases.local_compile_perf.candidates import current, reject
from phases.local_compile_perf.devlog import log
from phases.local_compile_perf.records import Plan
from phases.local_compile_perf.results import CandidateVerdict, Correctness, GraphBudget, ScreenConfirm, StackEntry
from phases.local_compile_perf.stack import (
    CandidateRefused, check_scope, commit_stack_entry, enable_in_recipe, release_candidate, stack_entries, stack_tip,
)


def timing_kind(ctx: PhaseContext) -> str:
    """How far the entry's timing can be trusted: CUDA events gate; a host timer's deltas are indicative only."""
    cuda = ctx.result("plan", Plan).cuda
    return "cuda events (gated)" if cuda else "host timer: indicative, not gated"


def run(ctx: PhaseContext) -> PhaseResult:
    cand = current(ctx)
    prepared = cand.prepared
    regions = list(prepared.candidate_regions)
    checkout = Path(prepared.candidate_checkout)
    try:
        recipe_edit = enable_in_recipe(checkout, regions)
    except CandidateRefused as exc:
        return reject(ctx, cand, str(exc))
    scope = check_scope(checkout, parent=prepared.tip, regions=regions)
    if scope["shared_default_edits"]:
        return reject(ctx, cand, f"enables regions in a shared default list: {scope['shared_default_edits']}",
                      numbers={"scope": scope})
    previous = stack_tip(ctx.state)
    position = len(stack_entries(ctx.state)) + 1
    entry = commit_stack_entry(ctx.target, prepared, previous=previous, position=position, label=cand.label)
    release_candidate(ctx.target, prepared, keep_as=None)
    confirm = ctx.result("screen_confirm", ScreenConfirm)
    stacked = StackEntry(
        position=position, **entry, label=cand.label, candidate=cand.id, source_branch=cand.branch,
        regions=tuple(regions), stack_regions_before=prepared.stack_regions, recipe_edit=recipe_edit, **scope,
        timing=timing_kind(ctx), judged=confirm.judged, replay=confirm.replay, confirm_rows=confirm.rows,
        correctness=ctx.result("correctness", Correctness).comparisons,
        graphs=ctx.result("graph_budget", GraphBudget).graphs)
    ctx.add_record("stack_entry", stacked)
    ctx.add_record("candidate_verdict", CandidateVerdict(
        id=cand.id, branch=cand.branch, label=cand.label, verdict="validated", phase=ctx.phase,
        reason=confirm.ruling.reason, numbers={"judged": [j.model_dump(mode="json") for j in confirm.judged]},
        kept_branch=entry["branch"]))
    record = stacked.model_dump(mode="json")
    log(ctx, f"committed {cand.label!r} as {entry['branch']} ({entry['commit'][:10]} on {previous[:10]}, linear "
             f"{entry['linear']}); regions {regions} enabled in {recipe_edit or 'the branch itself'}; "
             f"reaching recipes: {scope['reaching_recipes'] or ['none found']}", kind="decision")
    return PhaseResult(outcome="passed", summary=f"commit: {entry['branch']}", data=record, route="loop")
