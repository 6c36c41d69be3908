"""Audit the trail's meaning against the workflow table, and its head against the anchor.

A hash chain proves the lines are unchanged since they were hashed; it says nothing about
whether they follow the workflow. ``check_meaning`` replays the events against the table:

- the run starts in the table's first phase;
- each ``phase_started`` is for the phase the run is in, with the next attempt number, and no
  attempt is left open without a ``phase_interrupted``;
- each ``phase_completed`` closes the open attempt of that phase;
- each ``transition_taken`` leaves the current phase after its latest attempt passed, along the
  edge the completion named (so no phase is skipped), and ``run_finished`` comes only in "done";
- each answer answers a pending question (or is a person's start option, before any phase ran);
  a human-only question is answered by actor human; ``agent_acted`` is by actor agent;
- in a run whose ``run_started`` records who started it (``who``), every event by a person or an agent
  records who too: the engine's writer puts it on each one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.waivers import parse_key
from orchestrator.workflow import DONE


@dataclass
class _Walk:
    phase: str
    attempts: dict[str, int] = field(default_factory=dict)
    open_attempt: tuple[str, int] | None = None
    passed_route: str | None = None
    """Route of the current phase's latest completion when it passed (cleared by a new start)."""
    pending: dict[str, bool] = field(default_factory=dict)
    """Pending question key -> human_only."""
    any_phase_ran: bool = False
    findings: dict[str, set[str]] = field(default_factory=dict)
    """Phase -> finding codes of its latest completion."""
    waived: set[tuple[str, str]] = field(default_factory=set)
    """(phase, code) a person waived."""


def check_meaning(events: list[dict[str, Any]], workflow: Any) -> list[tuple[int | None, str]]:
    """(seq, message) for each event that does not follow ``workflow``'s table."""
    if not events or events[0].get("type") != "run_started":
        return [(None, "the trail does not start with run_started")]
    first = events[0]["data"]
    if first.get("initial_phase") != workflow.initial:
        return [(0, f"the run starts in {first.get('initial_phase')!r}, "
                    f"the table's first phase is {workflow.initial!r}")]
    walk = _Walk(phase=workflow.initial)
    found: list[tuple[int | None, str]] = []
    records_who = "who" in events[0]
    for event in events[1:]:
        check = _CHECKS.get(event["type"])
        if check is not None:
            found += [(event["seq"], message) for message in check(walk, event, workflow)]
        if records_who and "who" not in event and event["actor"] != "engine":
            found.append((event["seq"], f"{event['type']} by {event['actor']} records no one (no `who`), though "
                                        "this run records who acted on every act from its start"))
        if len(found) > 50:
            found.append((None, "more than 50 meaning findings; stopped"))
            break
    return found


def _phase_started(walk: _Walk, event: dict[str, Any], workflow: Any) -> list[str]:
    problems = []
    phase, attempt = event["phase"], event["data"]["attempt"]
    if phase != walk.phase:
        problems.append(f"phase {phase!r} started while the run is in {walk.phase!r}")
    if walk.open_attempt is not None:
        problems.append(f"attempt {walk.open_attempt[1]} of {walk.open_attempt[0]!r} was never completed or "
                        "marked interrupted")
    if attempt != walk.attempts.get(phase, 0) + 1:
        problems.append(f"attempt {attempt} of {phase!r} follows attempt {walk.attempts.get(phase, 0)}")
    walk.attempts[phase] = attempt
    walk.open_attempt, walk.passed_route, walk.any_phase_ran = (phase, attempt), None, True
    return problems


def _phase_interrupted(walk: _Walk, event: dict[str, Any], workflow: Any) -> list[str]:
    key = (event["phase"], event["data"]["attempt"])
    if walk.open_attempt != key:
        return [f"phase_interrupted for {key} but the open attempt is {walk.open_attempt}"]
    walk.open_attempt = None
    return []


def _phase_completed(walk: _Walk, event: dict[str, Any], workflow: Any) -> list[str]:
    key = (event["phase"], event["data"]["attempt"])
    if walk.open_attempt != key:
        return [f"{key[0]!r} attempt {key[1]} completed without being started (open: {walk.open_attempt})"]
    walk.open_attempt = None
    walk.passed_route = event["data"].get("route", "next") if event["data"]["outcome"] == "passed" else None
    walk.findings[key[0]] = {issue["code"] for issue in event["data"].get("issues", [])}
    unwaived = sorted(code for code in event["data"].get("data", {}).get("waived", {})
                      if (key[0], code) not in walk.waived)
    return [f"{key[0]!r} completed with {unwaived} waived, but no person waived them"] if unwaived else []


def _transition_taken(walk: _Walk, event: dict[str, Any], workflow: Any) -> list[str]:
    data = event["data"]
    if data["source"] != walk.phase:
        return [f"transition from {data['source']!r} while the run is in {walk.phase!r}"]
    if walk.passed_route is None:
        return [f"transition {data['source']} -> {data['dest']} without a passed completion of {walk.phase!r} "
                "(a phase was skipped)"]
    try:
        edges = workflow.edges(workflow.phase(walk.phase))
    except StopIteration:
        return [f"phase {walk.phase!r} is not in the workflow table"]
    expected = edges.get(walk.passed_route)
    if data["dest"] != expected or data["trigger"] != f"route_{walk.passed_route}":
        return [f"transition {data['source']} -> {data['dest']} ({data['trigger']}) is not the table's edge "
                f"{walk.passed_route!r} -> {expected!r}"]
    walk.phase, walk.passed_route = data["dest"], None
    return []


def _question_asked(walk: _Walk, event: dict[str, Any], workflow: Any) -> list[str]:
    walk.pending[event["data"]["key"]] = bool(event["data"].get("human_only", True))
    return []


def _answer_accepted(walk: _Walk, event: dict[str, Any], workflow: Any) -> list[str]:
    key, actor = event["data"]["key"], event["actor"]
    waiver = parse_key(key)
    if waiver is not None:
        return _waiver(walk, waiver, event)
    if key in walk.pending:
        human_only = walk.pending.pop(key)
        if human_only and actor != "human":
            return [f"human-only question {key!r} answered by {actor}"]
        return []
    if not walk.any_phase_ran and actor == "human":
        return []  # a person's start option (e.g. --branch) answering the question ahead of time
    return [f"answer {key!r} by {actor} to a question nobody asked (a pre-answer)"]


def _waiver(walk: _Walk, waiver: tuple[str, str], event: dict[str, Any]) -> list[str]:
    phase, code = waiver
    problems = []
    if event["actor"] != "human":
        problems.append(f"finding {code!r} of {phase!r} waived by {event['actor']} (only a person may waive)")
    if not str(event["data"].get("value", "")).strip():
        problems.append(f"finding {code!r} of {phase!r} waived without a reason")
    if phase != walk.phase or code not in walk.findings.get(phase, set()):
        problems.append(f"waiver of {code!r} in {phase!r}, which is not a finding of the phase the run is in")
    walk.waived.add((phase, code))
    return problems


def _run_finished(walk: _Walk, event: dict[str, Any], workflow: Any) -> list[str]:
    return [] if walk.phase == DONE else [f"run_finished while the run is in {walk.phase!r}"]


def _run_aborted(walk: _Walk, event: dict[str, Any], workflow: Any) -> list[str]:
    walk.pending.clear()
    return []


def _agent_acted(walk: _Walk, event: dict[str, Any], workflow: Any) -> list[str]:
    return [] if event["actor"] == "agent" else [f"agent_acted recorded with actor {event['actor']!r}"]


_CHECKS = {
    "phase_started": _phase_started, "phase_interrupted": _phase_interrupted, "phase_completed": _phase_completed,
    "transition_taken": _transition_taken, "question_asked": _question_asked, "answer_accepted": _answer_accepted,
    "run_finished": _run_finished, "run_aborted": _run_aborted, "agent_acted": _agent_acted,
}
