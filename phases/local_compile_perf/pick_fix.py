"""Step 5, pick a fix: the agent chooses and writes the rewrite; the engine waits for it.

Without a pending submission the phase waits for the agent with the ranked list, the stop
rule, the stack so far and the rejected candidates, and asks (agent may answer) whether
the stack is complete. A submission is replayed on the stack tip here; one that does not
apply is rejected at once. Answering ``candidates=done`` moves on to the findings.
"""

from __future__ import annotations

from typing import Any, Sequence

from orchestrator.phase_api import Issue, PhaseContext, PhaseResult, Question
from phases.local_compile_perf.candidates import naming, pending_submission, reject, submissions, verdicts
from phases.local_compile_perf.devlog import log
from phases.local_compile_perf.records import Candidate, Picked
from phases.local_compile_perf.region_offer import not_enabled
from phases.local_compile_perf.results import CandidateVerdict, GlueRow, IdealTimes, Rank
from phases.local_compile_perf.stack import (
    CandidateRefused, prepare_candidate, stack_entries, stack_tip, worktree_root,
)
from phases.local_compile_perf.stop_state import ranking_line, stop_line, stop_rule_now

LADDER = ("enable an existing region", "resize a region",
          "rewrite the function so it lowers well (e.g. complex ops as real arithmetic, a gather-sum combine, "
          "producer + cat + consumer in one region)",
          "add a region-scoped option", "autograd.Function with a hand-written backward")


def run(ctx: PhaseContext) -> PhaseResult:
    submission = pending_submission(ctx.state)
    if submission is not None:
        return take_submission(ctx, submission)
    if ctx.answers.get("candidates") == "done":
        log(ctx, f"stack complete: {len(stack_entries(ctx.state))} change(s), {len(verdicts(ctx.state))} candidate(s) "
                 "ruled on", kind="decision")
        return PhaseResult(outcome="passed", summary="pick a fix: stack complete", route="finish",
                           data={"stack": stack_entries(ctx.state)})
    return wait_for_agent(ctx)


def wait_for_agent(ctx: PhaseContext) -> PhaseResult:
    rank, ideal_rows = ctx.result("rank", Rank), ctx.result("ideal_times", IdealTimes).rows
    run_id = ctx.run_id
    now = stop_rule_now(rank, ideal_rows=ideal_rows, entries=stack_entries(ctx.state))
    summary = (f"pick a fix: {last_verdict(verdicts(ctx.state), submissions(ctx.state))}{ranking_line(rank)}; "
               f"{stop_line(now)}; "
               f"make a branch with the commit_branch tool and submit it (tool submit, kind candidate; "
               f"CLI `orchestrator candidate {run_id} --branch B --label TEXT`)")
    message = "; ".join(f"{r.op}: gap {r.gap_ms:.3f} ms, score {r.score_ms:.3f} ms" for r in rank.ranked[:5])
    idle = not_enabled(ctx.target, stack_tip(ctx.state))
    offers = best_known_offers(ideal_rows)
    issue = Issue(code="candidate_wanted", fix_location=f"a new branch of {ctx.target}",
                  message=f"write a rewrite on a branch of {ctx.target} (ladder: {' -> '.join(LADDER)}); ranked: "
                          f"{message or 'none above the threshold'}; stop rule: {now.reason}; "
                          f"a candidate enables only the regions it names ({naming(['a', 'b'])}, or "
                          f"{naming([])}); declared and "
                          f"not enabled on the stack: {', '.join(f'{r} ({p})' for r, p in idle.items()) or 'none'}; "
                          f"best-known kernels faster than the op (a candidate calls one from the region's function): "
                          f"{'; '.join(offers) or 'none measured'}")
    question = Question(key="candidates", prompt="Is the stack complete? Answer done to write the stack and "
                        "findings; otherwise submit another candidate branch.", choices=("done",), human_only=False)
    data = {"ranked": [r.model_dump(mode="json") for r in rank.ranked], "stop": rank.stop.model_dump(mode="json"),
            "stop_now": now.as_data(), "stack": stack_entries(ctx.state),
            "verdicts": [v.model_dump(mode="json") for v in verdicts(ctx.state)], "regions_not_enabled": idle,
            "best_known_offers": offers}
    return PhaseResult(outcome="needs_agent", summary=summary, data=data, issues=(issue,), questions=(question,))


def last_verdict(ruled: Sequence[CandidateVerdict], submitted: Sequence[Candidate] = ()) -> str:
    """The latest candidate's verdict, leading the summary a submit answers with ("" before any), and the
    regions it named that its changes do not touch."""
    if not ruled:
        return ""
    v = ruled[-1]
    reason = v.reason if len(v.reason) <= 300 else v.reason[:300] + "... (explain has it all)"
    named = next((s for s in submitted if s.id == v.id), None)
    untouched = untouched_line(named)
    return f"last candidate {v.label!r} {v.verdict} at {v.phase}: {reason}; " + (f"{untouched}; " if untouched else "")


def untouched_line(candidate: Candidate | None) -> str:
    """``it named regions its changes do not touch: rope (rope.py) (...)``, or "" when there are none."""
    if candidate is None or not candidate.untouched_regions:
        return ""
    where = ", ".join(f"{name} ({path})" for name, path in candidate.untouched_regions.items())
    return f"it named regions its changes do not touch: {where} (enabled as declared)"


def best_known_offers(rows: Sequence[GlueRow]) -> list[str]:
    """The ideal-times rows whose best-known kernel beat the op as measured there (eager, same arguments)."""
    return [f"{r.op}: {r.best_known} {r.best_known_ms:.4f} ms/step against {r.measured_ms:.4f} eager"
            for r in rows if r.best_known_ms is not None and r.best_known_ms < r.measured_ms]


def take_submission(ctx: PhaseContext, candidate: Candidate) -> PhaseResult:
    try:
        prepared = prepare_candidate(ctx.target, state=ctx.state, submission=candidate, root=worktree_root(ctx))
    except CandidateRefused as exc:
        return reject(ctx, candidate, str(exc))
    candidate = candidate.model_copy(update={"prepared": prepared})
    p = prepared
    log(ctx, f"candidate {candidate.label!r} from {candidate.branch} ({len(p.commits)} commit(s), files "
             f"{', '.join(p.files)}) replayed on {p.tip[:10]} as {p.wip_branch}; regions "
             f"{list(p.candidate_regions) or 'none'} ({p.regions_source}) on top of {list(p.stack_regions)}"
             + (f"; {untouched_line(candidate)}" if candidate.untouched_regions else ""),
        kind="decision")
    return PhaseResult(outcome="passed", summary=f"pick a fix: trying {candidate.label!r}",
                       data=Picked(candidate=candidate).model_dump(mode="json"))
