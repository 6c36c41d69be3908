"""Read a trail once and say what is wrong with it: the one check behind ``open_run`` and ``audit``.

``inspect_trail`` parses events.jsonl (complete lines; a torn tail is reported), walks the hash
chain, verifies the signed heads (in the log, ``signed_log``, and outside the state dir, ``anchor``)
against the public key the run recorded at genesis, and decides what a writer may repair: a write
announced (in the log or by the anchor) that did not fully land (killed mid-write) is cut back to
the previous head. Everything else is a finding that refuses the run. ``store.open_run`` acts on
the report; ``audit`` prints it and adds its slower checks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.trail import pinning, signed_log, signing
from orchestrator.trail.anchor import Anchor, AnchorError, Head, read_anchor, verify_record
from orchestrator.trail.chain import GENESIS_HASH, chain_hash, verified_prefix
from orchestrator.trail.findings import Finding
from orchestrator.trail.trail_io import EVENTS, parse_events, split_lines

__all__ = ["Finding", "TrailReport", "decide", "inspect_trail"]


@dataclass(kw_only=True, slots=True)
class TrailReport:
    run_id: str
    lines: list[bytes] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    torn: bytes = b""
    findings: list[Finding] = field(default_factory=list)
    keep: int = 0
    """How many events stay after a writer's repair."""
    signer: dict[str, Any] | None = None
    """The public key the run recorded at genesis (None: a legacy HMAC run)."""
    signed_by: str | None = None
    announced: Head | None = None
    """The head of a write that did not land (a writer's repair records the seqs up to it as lost)."""
    in_log: bool = False
    """The run's writes carry their signed heads in the log (``signed_log``)."""
    notes: list[str] = field(default_factory=list)
    """What is worth saying but wrong with nothing (an anchor that lags the log's signed head)."""
    check_pin: bool = False
    """The signer was checked against a key the caller pinned (audit), not against this anchor dir's own."""

    @property
    def blocking(self) -> list[Finding]:
        return [f for f in self.findings if not f.repairable]


def inspect_trail(run_dir: Path, *, anchor: bool = True, every_signature: bool = False,
                  witnesses: tuple[tuple[str, bytes | None], ...] = (), check_pin: bool = False,
                  pin: pinning.Pin | None = None) -> TrailReport:
    """``witnesses``: (where, the witnessed head record) pairs, as ``witness.read_witness`` reads them.

    In-log heads: a writer checks the signatures the verified anchor does not already vouch for
    through the chain (``signed_log.to_verify``); ``every_signature`` (audit) checks them all.
    ``check_pin`` (audit): the run's signer is checked against ``pin``, the key the auditor pinned (None:
    none was, which is itself a finding), instead of against this anchor dir's own key.
    """
    report = TrailReport(run_id=run_dir.name)
    _parse(report, run_dir / EVENTS)
    if report.blocking:
        return report
    report.findings += check_chain(report.events, run_id=report.run_id, lines=report.lines)
    report.keep = len(report.events)
    report.signer = genesis_signer(report.events[0])
    report.in_log = signed_log.heads_in_log(report.events[0])
    if report.blocking:
        return report
    report.check_pin = check_pin
    if check_pin and (wrong := pinning.key_finding(report.signer, pin)) is not None:
        report.findings.append(wrong)
    if report.in_log:
        _check_log_heads(report, anchor=anchor, every=every_signature)
    elif (stray := signed_log.stray_head(report.events)) is not None:
        report.findings.append(stray)
    elif anchor:
        _check_anchor(report)
    if anchor:
        report.findings += [f for w in witnesses if (f := _witness_finding(report, w)) is not None]
    return report


def _parse(report: TrailReport, path: Path) -> None:
    if not path.is_file():
        report.findings.append(Finding(seq=None, check="chain", message=f"{path.name} is missing"))
        return
    report.lines, report.torn = split_lines(path.read_bytes())
    if report.torn:
        report.findings.append(Finding(seq=len(report.lines), check="chain", repairable=True,
                                       message=f"line {len(report.lines) + 1} is truncated (no final newline)"))
    report.events, problems = parse_events(report.lines)
    report.findings += [Finding(seq=None, check="chain", message=p) for p in problems]
    if not problems and not report.events:
        torn = " (its one line is truncated)" if report.torn else ""
        report.findings.append(Finding(seq=None, check="chain", message=f"the trail has no complete event{torn}"))


def genesis_signer(first: dict[str, Any]) -> dict[str, Any] | None:
    data = first.get("data") if isinstance(first.get("data"), dict) else {}
    signer = data.get("signer")
    return signer if isinstance(signer, dict) and isinstance(signer.get("public_key"), str) else None


def _read_signed_anchor(report: TrailReport) -> Anchor | None:
    """The verified anchor, or None with the finding that says why not."""
    own = None if report.check_pin else signing.own_signer(create=False)
    if report.signer is not None and own is not None and own["public_key"] != report.signer["public_key"]:
        report.findings.append(Finding(seq=0, check="anchor", message=(
            f"the run's genesis names {signing.describe(report.signer)}, but this anchor dir signs with "
            f"{signing.describe(own)}: a swapped public key or a key change mid-run")))
        return None
    try:
        return read_anchor(report.run_id, report.events[0]["hash"], report.signer)
    except AnchorError as exc:
        report.findings.append(Finding(seq=None, check="anchor", message=str(exc)))
        return None


def _check_anchor(report: TrailReport) -> None:
    """A run whose heads live in the anchor alone (made before in-log heads)."""
    signed = _read_signed_anchor(report)
    if signed is None:
        return
    report.signed_by, report.announced = signed.signed_by, signed.head
    report.keep, finding = decide(report.events, report.torn, signed)
    if finding is not None:
        report.findings.append(finding)


def _check_log_heads(report: TrailReport, *, anchor: bool, every: bool) -> None:
    """A run with in-log heads: the log's own signatures, then the anchor (``signed_log.decide``)."""
    heads = signed_log.read_heads(report.events)
    problem = heads.finding or _unsigned_run(report, heads)
    if problem is not None:
        report.findings.append(problem)
        return
    signed = _read_signed_anchor(report) if anchor else None
    for write in signed_log.to_verify(heads, signed.head if signed else None, every=every):
        if (bad := signed_log.bad_signature(write, report.events, report.run_id, report.signer)) is not None:
            report.findings.append(bad)
            return
    report.signed_by = signing.describe(report.signer)
    if anchor and signed is None:
        return
    decision = signed_log.decide(heads, report.torn, signed)
    report.keep, report.announced = decision.keep, decision.announced
    report.findings += [decision.finding] if decision.finding is not None else []
    report.notes += [decision.note] if decision.note is not None else []


def _unsigned_run(report: TrailReport, heads: signed_log.LogHeads) -> Finding | None:
    if report.signer is None:
        return Finding(seq=0, check="signature", message="the run's genesis says its heads are in the log but "
                                                         "names no key to check them")
    if heads.complete is None:
        return Finding(seq=0, check="signature", message="the run's first write is not complete")
    return None


def decide(events: list[dict[str, Any]], torn: bytes, anchor: Anchor) -> tuple[int, Finding | None]:
    """The one anchor decision: how many events stay, and what is wrong (repairable or not)."""
    last = Head(seq=events[-1]["seq"], hash=events[-1]["hash"])
    if last == anchor.head:
        if not torn:
            return len(events), None
        return len(events), Finding(seq=last.seq, check="anchor", message=(
            f"{len(torn)} bytes follow the anchored head (seq {last.seq})"))
    prev = anchor.prev
    if prev is not None and prev.seq < len(events) and events[prev.seq]["hash"] == prev.hash \
            and last.seq < anchor.head.seq:
        return prev.seq + 1, Finding(seq=prev.seq, check="anchor", repairable=True, message=(
            f"the write of seq {prev.seq + 1}..{anchor.head.seq} announced by the anchor is not (fully) in the log: "
            "a crash mid-write (the next writing command repairs it and records trail_repaired) or a dropped tail"))
    return len(events), Finding(seq=last.seq, check="anchor", message=(
        f"the log ends at seq {last.seq} but the anchor outside the state dir names seq {anchor.head.seq} "
        "with another hash: events were dropped, appended or re-hashed"))


def _witness_finding(report: TrailReport, witness: tuple[str, bytes | None]) -> Finding | None:
    """The trail must extend a head a witness holds: truncation or a fork after it is caught."""
    path, blob = witness
    try:
        if blob is None:
            raise ValueError("nothing witnessed there")
        record = json.loads(blob)
        witnessed = verify_record(record, report.run_id, report.events[0]["hash"], report.signer,
                                  where=f"witnessed head {path}")
    except AnchorError as exc:
        return Finding(seq=None, check="witness", message=str(exc))
    except ValueError:
        return Finding(seq=None, check="witness", message=f"witnessed head {path} is missing or not JSON")
    seq = witnessed.head.seq
    if seq >= len(report.events) or report.events[seq]["hash"] != witnessed.head.hash:
        return Finding(seq=seq, check="witness", message=(
            f"the trail does not extend the head witnessed in {path} (seq {seq}): it was truncated or forked"))
    return None


def check_chain(events: list[dict[str, Any]], *, run_id: str, lines: list[bytes] | None = None) -> list[Finding]:
    """seq 0.. without gaps, each prev_hash = the previous hash, each hash recomputed."""
    start = verified_prefix(events, lines, run_id=run_id) if lines is not None else 0
    findings, prev = [], events[start - 1]["hash"] if start else GENESIS_HASH
    for index in range(start, len(events)):
        findings += _chain_link(events[index], index, prev, run_id)
        prev = events[index].get("hash", "")
        if len(findings) > 50:
            findings.append(Finding(seq=None, check="chain", message="more than 50 chain findings; stopped"))
            break
    return findings


def _chain_link(event: dict[str, Any], index: int, prev: str, run_id: str) -> list[Finding]:
    seq, findings = event.get("seq"), []
    if seq != index:
        findings.append(Finding(seq=seq, check="chain", message=f"line {index + 1} has seq {seq}, expected {index} "
                                                                "(an event was deleted, inserted or reordered)"))
    if event.get("run_id") != run_id:
        findings.append(Finding(seq=seq, check="chain", message=f"run_id {event.get('run_id')!r} != {run_id!r}"))
    if event.get("prev_hash") != prev:
        findings.append(Finding(seq=seq, check="chain", message="prev_hash does not match the previous event"))
    try:
        expected = chain_hash(event.get("prev_hash", ""), {k: v for k, v in event.items() if k != "hash"})
    except ValueError as exc:
        expected = f"<unhashable: {exc}>"
    if event.get("hash") != expected:
        findings.append(Finding(seq=seq, check="chain", message="hash does not match the event's content "
                                                                "(the event was edited)"))
    return findings
