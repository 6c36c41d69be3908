"""What a ``resume`` recorded and what still waits, in text (stderr lines) and in ``--json``.

A resume can record a person's waiver or answer and still stop at a wait: a waiver of a
finding applies only when the phase runs again, and the phase does not run while a
question (the workflow's, or one the agent escalated) is open. So every resume says what
it kept, which questions still wait (key, who asked, the command that answers each), and,
when the run did not move, that it did not and why, instead of ending in silence at the
wait it started from.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from orchestrator.waivers import parse_key, unapplied_waivers

NOT_ADVANCED = (
    "recorded only (--no-advance): nothing re-ran, so the summary above is still the {phase} phase's from before; "
    "it runs again with `orchestrator advance {run_id}`"
)
AGENT_QUESTION_ONLY = (
    "answer recorded for the agent; the engine cannot act on an agent's question, so nothing was re-run. "
    "A person can waive a finding (`orchestrator resume {run_id} --waive CODE --reason TEXT`) or stop the run "
    "(`orchestrator abort {run_id} --reason TEXT`)"
)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class WaitPoint:
    """Where a run waits: phase, awaiting, open question keys and finding codes (for "did it move?")."""

    phase: str
    awaiting: str | None
    pending: tuple[str, ...]
    issues: tuple[str, ...]


def wait_point(state: dict[str, Any]) -> WaitPoint:
    return WaitPoint(phase=state["phase"], awaiting=state.get("awaiting"),
                     pending=tuple(q["key"] for q in state["pending"]),
                     issues=tuple(i["code"] for i in state["issues"]))


def recorded_items(parsed: dict[str, Any], *, agent_keys: set[str]) -> list[dict[str, Any]]:
    """Each waiver and answer the resume recorded, as the JSON ``recorded`` list."""
    items = []
    for key, value in parsed.items():
        waiver = parse_key(key)
        if waiver is not None:
            items.append({"kind": "waiver", "phase": waiver[0], "code": waiver[1], "reason": value})
        else:
            items.append({"kind": "answer", "key": key, "value": value,
                          "for": "agent" if key in agent_keys else "workflow"})
    return items


def still_waiting(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The open questions after the resume: key, prompt, who asked, who may answer, the command."""
    return [{"key": q["key"], "prompt": q["prompt"],
             "asked_by": "agent" if q["key"] in state["agent_asked"] else "workflow",
             "who": "human" if q["human_only"] else "human or agent",
             "answer_with": f"orchestrator resume {state['run_id']} --answer {q['key']}=VALUE"}
            for q in state["pending"]]


def report_lines(recorded: list[dict[str, Any]], waiting: list[dict[str, Any]], *, state: dict[str, Any],
                 moved: bool) -> list[str]:
    """One line per recorded item and per open question, then why the run stayed where it was."""
    lines = [_recorded_line(item) for item in recorded]
    for question in waiting:
        asked = "the agent's question" if question["asked_by"] == "agent" else "the workflow's question"
        lines.append(f"still waiting for a {question['who']}: question {question['key']!r} ({asked}: "
                     f"{question['prompt']}); answer it with `{question['answer_with']}`")
    if not moved:
        lines.append(_stayed_line(state, waiting))
    return lines


def _recorded_line(item: dict[str, Any]) -> str:
    if item["kind"] == "waiver":
        return f"recorded: waiver of {item['code']} (phase {item['phase']}), reason: {item['reason']}"
    return f"recorded: answer {item['key']}={item['value']} (for the {item['for']})"


def _stayed_line(state: dict[str, Any], waiting: list[dict[str, Any]]) -> str:
    pending = unapplied_waivers(state)
    keys = ", ".join(q["key"] for q in waiting)
    if pending and keys:
        return (f"the run did not move: phase {state['phase']} has not run again, so the waiver of "
                f"{', '.join(pending)} applies once question(s) {keys} are answered and the phase runs")
    if keys:
        return f"the run did not move: it waits in phase {state['phase']} on question(s) {keys}"
    return f"the run did not move: it waits in phase {state['phase']} as before this resume"


def with_report(outcome: Any, parsed: dict[str, Any], *, agent_keys: set[str], before: WaitPoint) -> Any:
    """``outcome`` with the report's lines first among its messages and the JSON fields in ``details``."""
    recorded, waiting = recorded_items(parsed, agent_keys=agent_keys), still_waiting(outcome.state)
    moved = wait_point(outcome.state) != before or outcome.state["status"] in ("done", "aborted")
    messages = (*report_lines(recorded, waiting, state=outcome.state, moved=moved), *outcome.messages)
    details = {"recorded": recorded, "still_waiting": waiting, "moved": moved, "messages": list(messages)}
    return dataclasses.replace(outcome, messages=messages, details=details)
