"""Candidates: the agent submits a branch; the engine measures it and rules on it.

A candidate is the workflow's ``candidate`` submission row (``engine.submit``: the
``orchestrator submit RUN candidate`` command, its ``candidate`` alias and the agent's ``submit``
tool): ``accept_candidate`` records a ``candidate_submitted`` record and the engine drives the run
on: pick_fix picks the submission up and replays it on the stack, then graph budget and the TP/EP
build check -> screen and confirm -> correctness -> commit and scope. Each of those phases either
passes the candidate on or rejects it (a ``candidate_verdict`` record with its numbers, route "rejected" back to
pick_fix); a validated one becomes the next ``stack/<n>-<label>`` branch. Rejection is a
finding, not a failure: the run goes on waiting for the next candidate.
"""

from __future__ import annotations

import json
import secrets
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, WithJsonSchema, field_validator

from orchestrator.errors import UsageError
from orchestrator.phase_api import PhaseContext, PhaseResult, Worker
from orchestrator.workflow import load_workflow
from phases.local_compile_perf.devlog import log
from phases.local_compile_perf.records import Candidate, Picked
from phases.local_compile_perf.results import CandidateVerdict

A = TypeVar("A")
PICK_PHASE = "pick_fix"
IN_CHECKOUT = "phases.local_compile_perf.work.checkout:run_in_checkout"
"""Worker that runs another worker inside a candidate's or the stack's checkout."""


def submissions(state: dict[str, Any]) -> list[Candidate]:
    """Every ``candidate_submitted`` record (a submission: a candidate not yet prepared), oldest first."""
    return load_workflow(state["workflow"]).records_in(state, Candidate)


def verdicts(state: dict[str, Any]) -> list[CandidateVerdict]:
    """Every ``candidate_verdict`` record, oldest first."""
    return load_workflow(state["workflow"]).records_in(state, CandidateVerdict)


def pending_submission(state: dict[str, Any]) -> Candidate | None:
    """The oldest submission without a verdict, or None."""
    ruled = {v.id for v in verdicts(state)}
    return next((s for s in submissions(state) if s.id not in ruled), None)


def in_checkout(checkout: str, worker: Worker[Any, A], request: BaseModel) -> tuple[Worker[Any, A], BaseModel]:
    """The IN_CHECKOUT handle and request that run ``worker`` with ``request`` inside ``checkout``:
    ``ctx.call(*in_checkout(path, SCREEN, request), label=...)`` answers ``worker``'s answer model."""
    from phases.local_compile_perf.work.checkout import InCheckoutRequest

    wrapped = InCheckoutRequest(checkout=checkout, func=worker.ref, models=worker.models(),
                                request=worker.request.model_validate(request).model_dump(mode="json"))
    return Worker(IN_CHECKOUT, InCheckoutRequest, worker.answer), wrapped


def current(ctx: PhaseContext) -> Candidate:
    """The candidate under test (what pick_fix prepared)."""
    return ctx.result(PICK_PHASE, Picked).candidate


def reject(ctx: PhaseContext, cand: Candidate, reason: str, *, numbers: dict[str, Any] | None = None) -> PhaseResult:
    """Record a rejection of ``cand`` with its numbers, keep its branch as rejected/<name>, go back to pick_fix."""
    from phases.local_compile_perf.stack import release_candidate

    kept_as = f"rejected/{cand.prepared.name}" if cand.prepared else None
    kept = release_candidate(ctx.target, cand.prepared, keep_as=kept_as) if cand.prepared else None
    verdict = CandidateVerdict(id=cand.id, branch=cand.branch, label=cand.label, verdict="rejected", phase=ctx.phase,
                               reason=reason, numbers=numbers or {}, kept_branch=kept and kept_as)
    ctx.add_record("candidate_verdict", verdict)
    log(ctx, f"dead end: candidate {cand.label!r} ({cand.branch}) rejected at {ctx.phase}: {reason}",
        kind="dead_end")
    return PhaseResult(outcome="passed", summary=f"{ctx.phase}: rejected {cand.label!r}: {reason}",
                       data={"verdict": verdict.model_dump(mode="json")}, route="rejected")


REGIONS_SCHEMA = {"type": ["array", "string", "null"], "items": {"type": "string"}}
"""What ``regions`` accepts, without ``anyOf`` (agents.md: tool schemas have none)."""


class CandidateArgs(BaseModel):
    """A candidate optimisation branch of the run's target, submitted for measurement (local-compile-perf)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
    branch: str
    """Git branch in the target that holds the candidate (any base; it is replayed onto the stack tip)."""
    label: str
    """Short label for the candidate, e.g. "fuse rmsnorm"; it names the stack branch."""
    regions: Annotated[tuple[str, ...] | None, WithJsonSchema(REGIONS_SCHEMA)] = None
    """Regions to enable with it, on top of the stack's: a list, "a,b", or "none". Exactly these are enabled.
    Left out, a branch whose changes touch regions the stack does not enable (a changed or new function that
    declares one) is refused, and the refusal names them: nothing is enabled by default. Any region declared in
    the branch's tree may be named; the submission records those its changes do not touch."""

    @field_validator("regions", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            return () if value.strip().lower() == "none" else tuple(r.strip() for r in value.split(",") if r.strip())
        return value


def accept_candidate(ctx: Any, args: CandidateArgs, tool_call_id: str | None) -> None:
    """The candidate row's check: refuse an empty label or unknown branch, else record the submission.

    The engine then drives the run on under the same lock: pick_fix picks the submission up.
    """
    if not args.label.strip():
        raise UsageError("candidate needs --label TEXT: it names the stack branch")
    _check_branch(ctx.state, branch=args.branch)
    regions, untouched = _named_regions(ctx.state, args)
    record = {"id": f"c{len(submissions(ctx.state)) + 1}-{secrets.token_hex(2)}", "branch": args.branch,
              "label": args.label.strip(), "regions": list(regions), "untouched_regions": untouched,
              "actor": ctx.actor, "tool_call_id": tool_call_id,
              "submitted_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    ctx.add_record("candidate_submitted", record)


def _check_branch(state: dict[str, Any], *, branch: str) -> None:
    import git

    heads = {h.name for h in git.Repo(Path(state["target"])).heads}
    if branch not in heads:
        raise UsageError(f"branch {branch!r} is not a branch of {state['target']}; create it there first "
                         f"(branches: {', '.join(sorted(heads))})")


def _named_regions(state: dict[str, Any], args: CandidateArgs) -> tuple[tuple[str, ...], dict[str, str]]:
    """The regions the submission names, and ``{region: path}`` of those the branch's changes do not touch.

    Refuses names the branch's tree does not declare, and no names where its changes touch regions the
    stack does not enable (region_offer.offered).
    """
    import git

    from phases.local_compile_perf.region_offer import declared_at, offered, touched
    from phases.local_compile_perf.stack import stack_tip

    target = Path(state["target"])
    if args.regions is None:
        _refuse_unnamed_offer(args.branch, offered(target, args.branch, stack_tip(state)))
        return (), {}
    known = declared_at(git.Repo(target), args.branch)
    unknown = [name for name in args.regions if name not in known]
    if unknown:
        raise UsageError(f"regions {unknown} are not declared anywhere in the tree of branch {args.branch!r} "
                         f"(declared: {', '.join(sorted(known)) or 'none'})")
    named = tuple(dict.fromkeys(args.regions))
    changed = touched(target, args.branch, stack_tip(state))
    return named, {name: known[name] for name in named if name not in changed}


def _refuse_unnamed_offer(branch: str, offer: dict[str, str]) -> None:
    """Refuse a submission that names no regions while its changes touch ones the stack does not enable."""
    if not offer:
        return
    where = ", ".join(f"{name} ({path})" for name, path in offer.items())
    raise UsageError(f"branch {branch!r} changes or adds the functions of regions the stack does not enable: "
                     f"{where}. A candidate enables only the regions it names: submit again naming them, "
                     f"{naming(list(offer))} (or a subset), or {naming([])}")


def naming(regions: list[str]) -> str:
    """How to name ``regions`` in a submission, over MCP and on the CLI (no regions: "none")."""
    if not regions:
        return 'regions "none" (CLI: --regions none)'
    return f"regions {json.dumps(regions, separators=(',', ':'))} (CLI: --regions {','.join(regions)})"
