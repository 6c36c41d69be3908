"""Candidates: the agent submits a branch; the engine measures it and rules on it.

``submit_candidate`` (the ``orchestrator candidate`` command and the agent's tool) takes the
run's lock, records a ``candidate_submitted`` record and drives the run on: pick_fix picks
the submission up and replays it on the stack, then graph budget -> screen and confirm ->
correctness -> commit and scope. Each of those phases either passes the candidate on or
rejects it (a ``candidate_verdict`` record with its numbers, route "rejected" back to
pick_fix); a validated one becomes the next ``stack/<n>-<label>`` branch. Rejection is a
finding, not a failure: the run goes on waiting for the next candidate.
"""

from __future__ import annotations

import secrets
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from orchestrator.errors import UsageError
from orchestrator.phase_api import PhaseContext, PhaseResult
from phases.local_compile_perf.devlog import log
from phases.local_compile_perf.records import Candidate, Picked

WORKFLOW_NAME = "local-compile-perf"
PICK_PHASE = "pick_fix"
IN_CHECKOUT = "phases.local_compile_perf.work.checkout:run_in_checkout"
"""Worker that runs another worker inside a candidate's or the stack's checkout."""


def submissions(state: dict[str, Any]) -> list[dict[str, Any]]:
    return list(state["records"].get("candidate_submitted", []))


def verdicts(state: dict[str, Any]) -> list[dict[str, Any]]:
    return list(state["records"].get("candidate_verdict", []))


def pending_submission(state: dict[str, Any]) -> dict[str, Any] | None:
    """The oldest submission without a verdict, or None."""
    ruled = {v["id"] for v in verdicts(state)}
    return next((s for s in submissions(state) if s["id"] not in ruled), None)


def in_checkout(checkout: str, func: str, request: BaseModel) -> dict[str, Any]:
    """The IN_CHECKOUT worker's request: run ``func`` with ``request`` inside ``checkout``."""
    from phases.local_compile_perf.work.checkout import InCheckoutRequest

    wrapped = InCheckoutRequest(checkout=checkout, func=func, request=request.model_dump(mode="json"))
    return wrapped.model_dump(mode="json")


def current(ctx: PhaseContext) -> Candidate:
    """The candidate under test (what pick_fix prepared)."""
    return ctx.result(PICK_PHASE, Picked).candidate


def reject(ctx: PhaseContext, cand: Candidate, reason: str, *, numbers: dict[str, Any] | None = None) -> PhaseResult:
    """Record a rejection of ``cand`` with its numbers, keep its branch as rejected/<name>, go back to pick_fix."""
    from phases.local_compile_perf.stack import release_candidate

    kept_as = f"rejected/{cand.prepared.name}" if cand.prepared else None
    kept = release_candidate(ctx.target, cand.prepared, keep_as=kept_as) if cand.prepared else None
    record = {"id": cand.id, "branch": cand.branch, "label": cand.label, "verdict": "rejected",
              "phase": ctx.phase, "reason": reason, "numbers": numbers or {}, "kept_branch": kept and kept_as}
    ctx.add_record("candidate_verdict", record)
    log(ctx, f"dead end: candidate {cand.label!r} ({cand.branch}) rejected at {ctx.phase}: {reason}",
        kind="dead_end")
    return PhaseResult(outcome="passed", summary=f"{ctx.phase}: rejected {cand.label!r}: {reason}",
                       data={"verdict": record}, route="rejected")


def submit_candidate(run_id: str, *, branch: str, label: str, store: Any, actor: str,
                     tool_call_id: str | None = None, regions: tuple[str, ...] = (),
                     progress: Any = None) -> Any:
    """Record a candidate branch for run ``run_id`` and advance the candidate phases.

    Args:
        run_id: a local-compile-perf run waiting in pick_fix.
        branch: a branch of the run's target holding the rewrite (any base; it is replayed
            onto the stack tip).
        label: short name, e.g. "real-arithmetic RoPE"; names the stack branch.
        store: the RunStore.
        actor: "agent" or "human" (who submitted).
        tool_call_id: the agent tool call, when submitted through a tool.
        regions: regions to enable with it (default: those declared in its changed files).

    Returns:
        orchestrator.engine.Outcome after the run stopped again (next pick, or a failure).

    Raises:
        UsageError: wrong workflow, the run is not waiting in pick_fix, empty label or
            unknown branch (nothing is recorded then).
    """
    from orchestrator import engine
    from orchestrator import events as ev
    from orchestrator.workflow import load_workflow

    if not label.strip():
        raise UsageError("candidate needs --label TEXT: it names the stack branch")
    with store.open_run(run_id) as run:
        state = run.state
        engine.refuse_terminal(state)
        _check_submittable(state, branch=branch)
        record = {"id": f"c{len(submissions(state)) + 1}-{secrets.token_hex(2)}", "branch": branch,
                  "label": label.strip(), "regions": list(regions), "actor": actor, "tool_call_id": tool_call_id,
                  "submitted_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        run.append(ev.RecordAdded(kind="candidate_submitted", record=record), actor=actor, phase=state["phase"])
        run.flush()
        workflow = load_workflow(state["workflow"])
        # NOTE: driven under the lock taken here, so no other command can slip in between
        # the submission and the phases that rule on it.
        return engine.drive_open_run(run, workflow, progress=progress or (lambda _m: None), max_phases=None)


def _check_submittable(state: dict[str, Any], *, branch: str) -> None:
    import git

    if state["workflow"] != WORKFLOW_NAME:
        raise UsageError(f"run {state['run_id']} is a {state['workflow']} run; candidates belong to {WORKFLOW_NAME}")
    if state["phase"] != PICK_PHASE:
        raise UsageError(f"run {state['run_id']} is in phase {state['phase']}; candidates are taken while it "
                         f"waits in {PICK_PHASE} (run `orchestrator advance {state['run_id']}` first)")
    heads = {h.name for h in git.Repo(Path(state["target"])).heads}
    if branch not in heads:
        raise UsageError(f"branch {branch!r} is not a branch of {state['target']}; create it there first "
                         f"(branches: {', '.join(sorted(heads))})")
