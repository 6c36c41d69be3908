"""What a writer needs before it acts: the inspector's answer, the repair, and the state to write on.

``verify_for_writing`` (called by ``RunStore.open_run`` under the run's lock) refuses on the first
blocking finding of ``inspector.inspect_trail``, refuses a run whose genesis key is not the key
this machine signs with, cuts off a write the anchor says did not land, and folds the log,
checking run.json (it may lag after a crash, never disagree). The state the engine then uses is
the fold of the log, never run.json. Any failure raises TrailCorrupt with one line that names
``orchestrator audit RUN``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import TrailCorrupt
from orchestrator.trail import events as ev
from orchestrator.trail import signing
from orchestrator.trail.inspector import inspect_trail
from orchestrator.trail.snapshot import apply_event, empty_state
from orchestrator.trail.trail_io import EVENTS, SNAPSHOT


@dataclass(frozen=True, kw_only=True, slots=True)
class Verified:
    state: dict[str, Any]
    genesis: str
    signer: dict[str, Any] | None
    repair: ev.TrailRepaired | None
    in_log: bool


def verify_for_writing(run_dir: Path) -> Verified:
    run_id = run_dir.name
    report = inspect_trail(run_dir)
    if report.blocking:
        raise _corrupt(run_id, report.blocking[0].message)
    if report.signer is not None:
        try:
            own = signing.own_signer(create=True)
        except signing.AnchorError as exc:
            raise _corrupt(run_id, str(exc)) from None
        if own is None or own["public_key"] != report.signer["public_key"]:
            raise _corrupt(run_id, f"the run is signed by {signing.describe(report.signer)}; this machine holds "
                                   "another key, and a key change mid-run is refused")
    events, repair = report.events, None
    if report.keep < len(events) or report.torn:
        announced = report.announced.seq if report.announced is not None else len(events) - 1
        repair = ev.TrailRepaired(lost_seqs=list(range(report.keep, announced + 1)),
                                  dropped_lines=len(events) - report.keep, torn_bytes=len(report.torn))
        _truncate(run_dir / EVENTS, sum(len(line) + 1 for line in report.lines[:report.keep]))
        events = events[:report.keep]
    state = _fold_checking_snapshot(events, run_dir, run_id)
    return Verified(state=state, genesis=events[0]["hash"], signer=report.signer, repair=repair, in_log=report.in_log)


def _fold_checking_snapshot(events: list[dict[str, Any]], run_dir: Path, run_id: str) -> dict[str, Any]:
    try:
        stored = json.loads((run_dir / SNAPSHOT).read_bytes())
        claimed = stored["last_seq"]
    except (OSError, ValueError, KeyError, TypeError):
        raise _corrupt(run_id, f"{run_dir / SNAPSHOT} is missing or malformed") from None
    if not isinstance(claimed, int) or not -1 <= claimed < len(events):
        raise _corrupt(run_id, f"run.json claims seq {claimed!r}, the log ends at {len(events) - 1}")
    state = empty_state(run_id)
    matched = claimed == -1 and stored == state
    try:
        for event in events:
            apply_event(state, event)
            if event["seq"] == claimed:
                matched = stored == state
    except (KeyError, TypeError, AttributeError) as exc:
        raise _corrupt(run_id, f"the events do not fold ({exc!r})") from None
    if not matched:
        raise _corrupt(run_id, f"run.json differs from the fold of the log at seq {claimed} (it was edited)")
    return state


def _truncate(path: Path, size: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def _corrupt(run_id: str, what: str) -> TrailCorrupt:
    return TrailCorrupt(f"run {run_id}: {what}; the engine will not act on it: run `orchestrator audit {run_id}`")
