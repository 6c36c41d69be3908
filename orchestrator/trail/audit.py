"""Verify a run's trail: chain, schema, snapshot, artifacts, and the workflow's rules.

Every check reports ``Finding(seq, check, message)``; an empty list means the trail is
intact. The same checks are described in state/README.md so that an auditor can redo
them without this code.
"""

from __future__ import annotations

import gc
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.trail.identity import actors
from orchestrator.trail.inspector import Finding, inspect_trail
from orchestrator.trail.snapshot import replay
from orchestrator.trail.trail_io import ARTIFACTS, SNAPSHOT, resolved_path


@dataclass(frozen=True, kw_only=True, slots=True)
class Audit:
    findings: list[Finding]
    signed_by: str | None
    """Whose key signed the head (None when no signed head was checked or one did not verify)."""
    notes: list[str]
    """What is wrong with nothing but worth saying (an anchor that lags the log's signed head)."""
    signer: dict[str, Any] | None = None
    """The public key the run's genesis names (None: a legacy HMAC run, or a trail that could not be read)."""
    actors: list[dict[str, Any]] = field(default_factory=list)
    """Who acted: one row per person or agent with the seqs of their acts (``identity.actors``)."""


def audit_run(run_dir: Path, *, rules: dict[str, Any] | None = None, schema: bool = True,
              workflow: Any = None, anchor: bool = True) -> list[Finding]:
    return audit_trail(run_dir, rules=rules, schema=schema, workflow=workflow, anchor=anchor).findings


def audit_trail(run_dir: Path, *, rules: dict[str, Any] | None = None, schema: bool = True,
                workflow: Any = None, anchor: bool = True,
                witnesses: tuple[tuple[str, bytes | None], ...] = (), check_pin: bool = False,
                pin: Any = None) -> Audit:
    """All findings for the run at ``run_dir``; parsing problems stop the deeper checks.

    ``schema=False`` skips the pydantic validation of every event (the slowest check; the
    chain already proves the lines are what the engine wrote). ``workflow`` (the run's
    Workflow) turns on the meaning checks; ``anchor=False`` skips the anchor (a run copied
    from another machine, whose anchor stayed there). ``check_pin``: hold the run's signer to
    ``pin`` (``pinning.Pin``, the auditor's key; None: none was pinned, itself a finding).
    """
    # NOTE: parsing builds millions of small containers; the cyclic GC would rescan them
    # again and again (about half the time of a 100,000-event audit) and finds no cycles.
    gc.disable()
    try:
        report = inspect_trail(run_dir, anchor=anchor, every_signature=True, witnesses=witnesses,
                               check_pin=check_pin, pin=pin)
        notes = list(report.notes)
        findings = _audit(report, run_dir, rules=rules or {}, schema=schema, workflow=workflow, notes=notes)
        return Audit(findings=findings, signed_by=report.signed_by, notes=notes, signer=report.signer,
                     actors=actors(report.events))
    finally:
        gc.enable()


def _audit(report: Any, run_dir: Path, *, rules: dict[str, Any], schema: bool, workflow: Any,
           notes: list[str]) -> list[Finding]:
    """The findings; what is true of the run and worth saying but breaks nothing goes to ``notes``."""
    from orchestrator.trail.audit_meaning import check_meaning

    findings, events = list(report.findings), report.events
    if any(f.check == "chain" for f in findings):
        return findings
    if schema:
        from orchestrator.schemas import check_records

        findings += check_schema(events) + check_records(events, workflow)
    if any(f.check == "schema" for f in findings):
        return findings
    if workflow is not None:
        findings += [Finding(seq=seq, check="meaning", message=m) for seq, m in check_meaning(events, workflow)]
    try:
        state = replay(events, run_id=run_dir.name)
    except (KeyError, TypeError) as exc:
        return [Finding(seq=None, check="schema", message=f"the events do not replay: missing {exc}")]
    findings += check_snapshot(run_dir / SNAPSHOT, state)
    findings += check_artifacts(run_dir / ARTIFACTS, events)
    open_findings, open_notes = check_open_patches(state, events)
    findings += open_findings
    notes += open_notes
    if rules:
        state = {**state, "target": resolved_path(state["target"], run_dir.parent.parent)}
    for name, rule in rules.items():
        findings += [Finding(seq=seq, check=f"rule:{name}", message=msg) for seq, msg in rule(events, state)]
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


def check_open_patches(state: dict[str, Any], events: list[dict[str, Any]]) -> tuple[list[Finding], list[str]]:
    """An applied temporary patch: a note while the phase that applied it runs or waits (its measurements build
    on it, and it is reverted with proof before that phase passes); a finding once the run left that phase or
    ended."""
    applied_in = {e["seq"]: e.get("phase") for e in events if e["type"] == "patch_applied"}
    findings, notes = [], []
    for pid, patch in state["open_patches"].items():
        phase = applied_in.get(patch["seq"])
        if phase == state["phase"] and state["status"] in ("running", "waiting"):
            notes.append(f"temporary patch {pid} ({patch['label']}, seq {patch['seq']}) is applied while the run "
                         f"waits in phase {phase}, which applied it; it is reverted with proof before that phase "
                         "passes")
        else:
            findings.append(Finding(seq=patch["seq"], check="rule:no_open_patch",
                                    message=f"temporary patch {pid} ({patch['label']}) is still applied"))
    return findings, notes
