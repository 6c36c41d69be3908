"""Open a run for writing only from a verified log: the engine never acts on a trail it cannot vouch for.

``open_verified`` (called by ``RunStore.open_run`` under the run's lock):

1. every complete line is intact (seq, prev_hash, run_id, hash recomputed from the raw line);
2. the anchor outside the state dir (``orchestrator.trail.anchor``) verifies and names the log's head;
   when it names one write further, that write never fully landed (killed mid-write): its
   lines and any torn bytes are cut off and a ``trail_repaired`` event records what was lost;
3. run.json equals the fold of the events up to the seq it claims (it may lag after a crash,
   never disagree).

The state the engine then uses is the fold of the log, never run.json. Any failure raises
TrailCorrupt with one line that names ``orchestrator audit RUN``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from orchestrator.trail.anchor import Anchor, AnchorError, Head, read_anchor
from orchestrator.trail.chain import verified_prefix
from orchestrator.errors import TrailCorrupt
from orchestrator.trail.snapshot import apply_event, empty_state
from orchestrator.trail.trail_io import parse_lines, read_raw, split_lines


def open_verified(run_dir: Path) -> Any:
    from orchestrator.trail import events as ev
    from orchestrator.trail.store import EVENTS, OpenRun

    run_id = run_dir.name
    path = run_dir / EVENTS
    lines, torn = split_lines(read_raw(path))
    if not lines:
        raise _corrupt(run_id, f"{path} has no complete event")
    events = parse_lines(lines, path)
    intact = verified_prefix(events, lines, run_id=run_id)
    if intact != len(events):
        raise _corrupt(run_id, f"line {intact + 1} of {path} breaks the hash chain")
    genesis = events[0]["hash"]
    try:
        anchor = read_anchor(run_id, genesis)
    except AnchorError as exc:
        raise _corrupt(run_id, str(exc)) from None
    keep = _kept_events(events, torn, anchor, run_id)
    repair = None
    if keep < len(events) or torn or events[-1]["hash"] != anchor.head.hash:
        repair = ev.TrailRepaired(lost_seqs=list(range(keep, anchor.head.seq + 1)),
                                  dropped_lines=len(events) - keep, torn_bytes=len(torn))
        _truncate(path, sum(len(line) + 1 for line in lines[:keep]))
        events = events[:keep]
    state = _fold_checking_snapshot(events, run_dir, run_id)
    run = OpenRun(run_dir, state, genesis=genesis)
    if repair is not None:
        run.append(repair)
        run.flush()
    return run


def _kept_events(events: list[dict[str, Any]], torn: bytes, anchor: Anchor, run_id: str) -> int:
    """How many events stay: all of them when the anchor names the head, else up to anchor.prev."""
    last = Head(seq=events[-1]["seq"], hash=events[-1]["hash"])
    if last == anchor.head and not torn:
        return len(events)
    prev = anchor.prev
    landed_before = (prev is not None and prev.seq < len(events) and events[prev.seq]["hash"] == prev.hash
                     and last.seq < anchor.head.seq)
    if landed_before:
        return prev.seq + 1
    if last == anchor.head:
        raise _corrupt(run_id, f"{len(torn)} bytes follow the anchored head (seq {last.seq})")
    raise _corrupt(run_id, f"the log ends at seq {last.seq} but the anchor outside the state dir names seq "
                           f"{anchor.head.seq} (events were dropped, appended or re-hashed)")


def _fold_checking_snapshot(events: list[dict[str, Any]], run_dir: Path, run_id: str) -> dict[str, Any]:
    from orchestrator.trail.store import SNAPSHOT

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
