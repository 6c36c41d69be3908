"""Verify a run's trail: chain, schema, snapshot, artifacts, and the workflow's rules.

Every check reports ``Finding(seq, check, message)``; an empty list means the trail is
intact. The same checks are described in state/README.md so that an auditor can redo
them without this code.
"""

from __future__ import annotations

import gc
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.trail.chain import GENESIS_HASH, chain_hash, verified_prefix
from orchestrator.trail.snapshot import replay
from orchestrator.trail.store import ARTIFACTS, EVENTS, SNAPSHOT


@dataclass(frozen=True, kw_only=True, slots=True)
class Finding:
    seq: int | None
    """The event at fault (None for run-level findings such as a stale run.json)."""
    check: str
    """chain, schema, anchor, meaning, snapshot, artifact, or rule:<name>."""
    message: str


def audit_run(run_dir: Path, *, rules: dict[str, Any] | None = None, schema: bool = True,
              workflow: Any = None, anchor: bool = True) -> list[Finding]:
    """All findings for the run at ``run_dir``; parsing problems stop the deeper checks.

    ``schema=False`` skips the pydantic validation of every event (the slowest check; the
    chain already proves the lines are what the engine wrote). ``workflow`` (the run's
    Workflow) turns on the meaning checks; ``anchor=False`` skips the anchor (a run copied
    from another machine, whose anchor stayed there).
    """
    # NOTE: parsing builds millions of small containers; the cyclic GC would rescan them
    # again and again (about half the time of a 100,000-event audit) and finds no cycles.
    gc.disable()
    try:
        return _audit(run_dir, rules=rules or {}, schema=schema, workflow=workflow, anchor=anchor)
    finally:
        gc.enable()


def _audit(run_dir: Path, *, rules: dict[str, Any], schema: bool, workflow: Any, anchor: bool) -> list[Finding]:
    from orchestrator.trail.audit_meaning import check_anchor, check_meaning

    lines, events, findings = _parse_lines(run_dir / EVENTS)
    if findings:
        return findings
    findings += check_chain(events, run_id=run_dir.name, lines=lines)
    if schema:
        findings += check_schema(events)
    if findings:
        return findings
    if anchor:
        findings += [Finding(seq=seq, check="anchor", message=m) for seq, m in check_anchor(run_dir, events, False)]
    if workflow is not None:
        findings += [Finding(seq=seq, check="meaning", message=m) for seq, m in check_meaning(events, workflow)]
    try:
        state = replay(events, run_id=run_dir.name)
    except (KeyError, TypeError) as exc:
        return [Finding(seq=None, check="schema", message=f"the events do not replay: missing {exc}")]
    findings += check_snapshot(run_dir / SNAPSHOT, state)
    findings += check_artifacts(run_dir / ARTIFACTS, events)
    findings += check_open_patches(state)
    for name, rule in rules.items():
        findings += [Finding(seq=seq, check=f"rule:{name}", message=msg) for seq, msg in rule(events, state)]
    return findings


def _parse_lines(path: Path) -> tuple[list[bytes], list[dict[str, Any]], list[Finding]]:
    if not path.is_file():
        return [], [], [Finding(seq=None, check="chain", message=f"{path.name} is missing")]
    raw = path.read_bytes()
    findings = []
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    elif raw:
        findings.append(Finding(seq=len(lines) - 1, check="chain",
                                message=f"line {len(lines)} is truncated (no final newline)"))
    import orjson

    try:  # one parse of the whole log is much faster than a parse per line
        events = orjson.loads(b"[" + b",".join(lines) + b"]") if not findings else []
    except orjson.JSONDecodeError:
        events = []
    if not events:
        events = []
        for line_no, line in enumerate(lines, start=1):
            try:
                events.append(json.loads(line))
            except ValueError:
                findings.append(Finding(seq=line_no - 1, check="chain", message=f"line {line_no} is not JSON"))
    if not events and not findings:
        findings.append(Finding(seq=None, check="chain", message="the trail has no events"))
    return lines, events, findings


def check_chain(events: list[dict[str, Any]], *, run_id: str, lines: list[bytes] | None = None) -> list[Finding]:
    """seq 0.. without gaps, each prev_hash = the previous hash, each hash recomputed."""
    start = verified_prefix(events, lines, run_id=run_id) if lines is not None else 0
    findings, prev = [], events[start - 1]["hash"] if start else GENESIS_HASH
    for index in range(start, len(events)):
        event = events[index]
        seq = event.get("seq")
        if seq != index:
            findings.append(Finding(seq=seq, check="chain",
                                    message=f"line {index + 1} has seq {seq}, expected {index} "
                                            "(an event was deleted, inserted or reordered)"))
        if event.get("run_id") != run_id:
            findings.append(Finding(seq=seq, check="chain", message=f"run_id {event.get('run_id')!r} != {run_id!r}"))
        if event.get("prev_hash") != prev:
            findings.append(Finding(seq=seq, check="chain", message="prev_hash does not match the previous event"))
        body = {k: v for k, v in event.items() if k != "hash"}
        try:
            expected = chain_hash(event.get("prev_hash", ""), body)
        except ValueError as exc:
            expected = f"<unhashable: {exc}>"
        if event.get("hash") != expected:
            findings.append(Finding(seq=seq, check="chain", message="hash does not match the event's content "
                                                                    "(the event was edited)"))
        prev = event.get("hash", "")
        if len(findings) > 50:
            findings.append(Finding(seq=None, check="chain", message="more than 50 chain findings; stopped"))
            break
    return findings


def check_schema(events: list[dict[str, Any]]) -> list[Finding]:
    from pydantic import ValidationError

    from orchestrator.trail.events import EVENT_ADAPTER

    findings = []
    for event in events:
        try:
            EVENT_ADAPTER.validate_python(event)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            findings.append(Finding(seq=event.get("seq"), check="schema", message=f"{where}: {first['msg']}"))
    return findings


def check_snapshot(path: Path, replayed: dict[str, Any]) -> list[Finding]:
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return [Finding(seq=None, check="snapshot", message=f"{path.name} is missing or not JSON")]
    if stored == replayed:
        return []
    keys = sorted(k for k in set(stored) | set(replayed) if stored.get(k) != replayed.get(k))
    return [Finding(seq=replayed["last_seq"], check="snapshot",
                    message=f"{path.name} differs from the replay of the events in: {', '.join(keys)}")]


def check_artifacts(artifacts_dir: Path, events: list[dict[str, Any]]) -> list[Finding]:
    """Each artifact's latest recorded sha256 equals the file on disk."""
    latest: dict[str, tuple[int, str]] = {}
    for event in events:
        if event["type"] == "artifact_written":
            latest[event["data"]["name"]] = (event["seq"], event["data"]["sha256"])
    findings = []
    for name, (seq, sha) in sorted(latest.items()):
        path = artifacts_dir / name
        if not path.is_file():
            findings.append(Finding(seq=seq, check="artifact", message=f"artifacts/{name} is missing"))
        elif hashlib.sha256(path.read_bytes()).hexdigest() != sha:
            findings.append(Finding(seq=seq, check="artifact", message=f"artifacts/{name} does not match its sha256"))
    return findings


def check_open_patches(state: dict[str, Any]) -> list[Finding]:
    return [Finding(seq=p["seq"], check="rule:no_open_patch",
                    message=f"temporary patch {pid} ({p['label']}) is still applied")
            for pid, p in state["open_patches"].items()]
