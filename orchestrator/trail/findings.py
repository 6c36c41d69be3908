"""What a check of the trail reports: one ``Finding`` per thing wrong (the inspector's and audit's vocabulary)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class Finding:
    seq: int | None
    """The event at fault (None for run-level findings such as a stale run.json)."""
    check: str
    """chain, schema, signature, anchor, witness, meaning, snapshot, artifact, or rule:<name>."""
    message: str
    repairable: bool = False
    """A write that did not land: the next writer cuts it off and records trail_repaired."""
