"""Where each number and cause of the documents was recorded: the seq of its event in the run's trail.

MODEL_COMPATIBILITY.md, the commit message and the run's summary restate what earlier phases measured;
each statement names the event that holds it ("numerics, seq 34" is line 34 of the run's events.jsonl),
so a reader finds the record behind every number with the trail alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

RESULT_OUTCOMES = ("passed", "needs_agent", "needs_human", "waiting_job")
"""The outcomes whose data becomes the phase's result in run.json (the snapshot's fold)."""
EVENT_TYPES = ("phase_completed", "answer_accepted", "record_added")
"""The events ``Cited.from_events`` reads (``ctx.events(*EVENT_TYPES)``)."""


@dataclass(frozen=True)
class Cited:
    """The seqs of one run's results, answers and records, read once from its events."""

    run_id: str
    completed: dict[str, int] = field(default_factory=dict)
    """Phase -> seq of the phase_completed event whose data is the phase's result."""
    answers: dict[str, int] = field(default_factory=dict)
    """Answer key -> seq of its (last) answer_accepted event."""
    records: dict[str, list[tuple[int, dict[str, Any]]]] = field(default_factory=dict)
    """Record kind -> (seq, record) of each record_added event, oldest first."""

    @classmethod
    def from_events(cls, run_id: str, events: list[dict[str, Any]]) -> Cited:
        cited = cls(run_id=run_id)
        for event in events:
            data = event["data"]
            if event["type"] == "phase_completed" and data.get("outcome") in RESULT_OUTCOMES:
                cited.completed[event["phase"]] = event["seq"]
            elif event["type"] == "answer_accepted":
                cited.answers[data["key"]] = event["seq"]
            elif event["type"] == "record_added":
                cited.records.setdefault(data["kind"], []).append((event["seq"], data["record"]))
        return cited

    def phase(self, name: str) -> str:
        """"numerics, seq 34" (or "numerics, no event" where the trail holds no result of it)."""
        seq = self.completed.get(name)
        return f"{name}, seq {seq}" if seq is not None else f"{name}, no event"

    def answer(self, key: str) -> int | None:
        return self.answers.get(key)

    def record(self, kind: str, record: dict[str, Any]) -> int | None:
        """The seq of the latest record of ``kind`` equal to ``record`` (None when none is)."""
        return next((seq for seq, found in reversed(self.records.get(kind, [])) if found == record), None)
