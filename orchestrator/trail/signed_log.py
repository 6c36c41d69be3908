"""Heads the log carries itself: each write's first line says, signed, where that write ends.

A run whose ``run_started`` has ``heads: "in_log"`` (every run made since writes cost one sync)
puts ``"signed_head": {"hash", "seq", "sig"}`` on the first line of each write: the head the log
stands at once the write's last line is in (``hash`` and ``seq`` are left out when the write is
that one line: its own), and the Ed25519 signature of ``anchor.signed_body`` for that head, with
``prev`` the event just before the line (null at seq 0). It is the very
signature the anchor file holds for that head. The member is left out of the chain hash
(``chain``), so it can sit on the write's first line, before the hashes it signs.

So the log verifies with the public key alone: every write is announced by a line only the key's
holder can sign, and ends where it says. After the last announced head there is nothing, or a
write cut short (its announcement is in, not all its lines), or lines someone without the key
appended (no announcement): ``decide`` tells them apart, with the anchor's help.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.trail import signing
from orchestrator.trail.anchor import Anchor, Head, signed_body
from orchestrator.trail.chain import SIGNED_HEAD
from orchestrator.trail.findings import Finding

IN_LOG = "in_log"


@dataclass(frozen=True, kw_only=True, slots=True)
class Write:
    start: int
    """The seq of its first line (the one that carries the signed head)."""
    head: Head
    """Where it ends, as announced."""
    sig: str


@dataclass(kw_only=True, slots=True)
class LogHeads:
    writes: list[Write] = field(default_factory=list)
    """The writes whose every line is in the log, in order."""
    pending: Write | None = None
    """The last write, when the log ends before the head it announced (a write cut short)."""
    finding: Finding | None = None

    @property
    def complete(self) -> Head | None:
        return self.writes[-1].head if self.writes else None


@dataclass(frozen=True, kw_only=True, slots=True)
class Decision:
    keep: int
    finding: Finding | None = None
    note: str | None = None
    """Said when the anchor lags the log's signed heads (its write-back was lost): no finding."""
    announced: Head | None = None
    """The head of a write that did not land (a repair records the seqs up to it as lost)."""


def heads_in_log(first: dict[str, Any]) -> bool:
    data = first.get("data") if isinstance(first.get("data"), dict) else {}
    return data.get("heads") == IN_LOG


def member(head: Head, sig: str, *, start: int) -> bytes:
    """The canonical JSON of the ``signed_head`` of a write from seq ``start`` to ``head`` (sorted keys)."""
    if head.seq == start:
        return f'{{"sig":"{sig}"}}'.encode()
    return f'{{"hash":"{head.hash}","seq":{head.seq},"sig":"{sig}"}}'.encode()


def member_dict(head: Head, sig: str, *, start: int) -> dict[str, Any]:
    """``member`` as the parsed line has it."""
    return {"sig": sig} if head.seq == start else {"hash": head.hash, "seq": head.seq, "sig": sig}


def read_heads(events: list[dict[str, Any]]) -> LogHeads:
    """The writes the log announces; a finding for the first line that breaks the pattern."""
    heads, index = LogHeads(), 0
    while index < len(events):
        write = _announced(events[index], index)
        if isinstance(write, Finding):
            heads.finding = write
            return heads
        end = min(write.head.seq, len(events) - 1)
        inner = next((i for i in range(index + 1, end + 1) if SIGNED_HEAD in events[i]), None)
        if inner is not None:
            heads.finding = Finding(seq=inner, check="signature", message=(
                f"seq {inner} carries a signed head inside the write announced at seq {index} "
                f"(to seq {write.head.seq})"))
            return heads
        if write.head.seq > end:
            heads.pending = write
            return heads
        if events[end].get("hash") != write.head.hash:
            heads.finding = Finding(seq=end, check="signature", message=(
                f"the write announced at seq {index} ends at seq {end} with another hash than it announced"))
            return heads
        heads.writes.append(write)
        index = end + 1
    return heads


def _announced(event: dict[str, Any], index: int) -> Write | Finding:
    signed = event.get(SIGNED_HEAD)
    if signed is None:
        return Finding(seq=index, check="signature", message=(
            f"the lines from seq {index} on carry no signed head: every write of this run starts with one, "
            "so they were appended by someone without the key"))
    try:
        if "seq" not in signed and "hash" not in signed:
            signed = {**signed, "seq": index, "hash": event["hash"]}
        head, sig = Head(seq=int(signed["seq"]), hash=str(signed["hash"])), str(signed["sig"])
        if head.seq < index:
            raise ValueError
    except (KeyError, TypeError, ValueError):
        return Finding(seq=index, check="signature", message=f"the signed head at seq {index} is malformed")
    return Write(start=index, head=head, sig=sig)


def stray_head(events: list[dict[str, Any]]) -> Finding | None:
    """A run whose heads live in the anchor alone has no signed head in its log (the chain hash cannot say so)."""
    seq = next((e.get("seq") for e in events if SIGNED_HEAD in e), None)
    return None if seq is None else Finding(seq=seq, check="signature", message=(
        f"seq {seq} carries a signed head, but the run's genesis does not say its heads are in the log"))


def to_verify(heads: LogHeads, anchored: Head | None, *, every: bool) -> list[Write]:
    """The writes whose signatures need checking: those a verified anchor's head does not already
    vouch for through the chain (without one, the last), the write cut short, or ``every`` one."""
    pending = [heads.pending] if heads.pending is not None else []
    if every:
        return heads.writes + pending
    ends = [w.head for w in heads.writes]
    if anchored in ends:
        return heads.writes[ends.index(anchored) + 1:] + pending
    return heads.writes[-1:] + pending


def bad_signature(write: Write, events: list[dict[str, Any]], run_id: str, signer: dict[str, Any]) -> Finding | None:
    prev = None if write.start == 0 else Head(seq=write.start - 1, hash=events[write.start - 1]["hash"])
    if signing.verify(signer["public_key"], write.sig, signed_body(run_id, events[0]["hash"], write.head, prev)):
        return None
    return Finding(seq=write.start, check="signature", message=(
        f"the head announced at seq {write.start} (to seq {write.head.seq}) has a bad signature: "
        f"{signing.describe(signer)} did not sign it"))


def decide(heads: LogHeads, torn: bytes, anchor: Anchor | None) -> Decision:
    """The anchor decision of a run with in-log heads (``anchor`` None: not checked).

    The log's own signatures vouch for every complete write; the anchor adds that the log was not
    cut behind what it knew. An anchor at an earlier signed head lags (its write-back was lost),
    which is no finding; one write ahead is a write cut short, as a bare announcement in the log is.
    An anchor naming a write after an earlier signed head that the log went on from with another
    write knew that head: its write did not land (a kill), and the write that replaced it was lost
    from the anchor's page (a power loss).
    """
    complete = heads.complete
    assert complete is not None
    ends = [w.head for w in heads.writes]
    if anchor is None or anchor.head in ends:
        return _known(heads, torn, anchor, None if anchor is None or anchor.head == complete else (
            f"the anchor names seq {anchor.head.seq}, an earlier signed head of the log"))
    pending = heads.pending
    if anchor.prev == complete and anchor.head.seq > complete.seq and (pending is None or pending.head == anchor.head):
        return Decision(keep=complete.seq + 1, finding=_cut_short(complete.seq + 1, anchor.head, "by the anchor"),
                        announced=anchor.head)
    if anchor.prev in ends:
        return _known(heads, torn, anchor, f"the anchor names a write after seq {anchor.prev.seq} that did not land, "
                                           "and the log went on from there with another")
    return Decision(keep=complete.seq + 1, finding=Finding(seq=complete.seq, check="anchor", message=(
        f"the log's last signed head is seq {complete.seq} but the anchor outside the state dir names seq "
        f"{anchor.head.seq} with another hash: events were dropped or re-hashed")))


def _known(heads: LogHeads, torn: bytes, anchor: Anchor | None, behind: str | None) -> Decision:
    """The anchor knew no more of the log than its signed heads say: only what follows the last one is left."""
    complete, pending = heads.complete, heads.pending
    assert complete is not None
    keep = complete.seq + 1
    note = behind and (f"{behind} (the log is signed to seq {complete.seq}): its write-back was lost, as in a power "
                       "loss; the log's own signatures vouch for the rest, and the next write brings it level")
    if pending is not None:
        return Decision(keep=keep, finding=_cut_short(pending.start, pending.head, "in the log"), note=note,
                        announced=pending.head)
    if torn and anchor is not None:
        return Decision(keep=keep, note=note, finding=Finding(seq=complete.seq, check="anchor", message=(
            f"{len(torn)} bytes follow the signed head (seq {complete.seq}) and no signed head announces them")))
    return Decision(keep=keep, note=note)


def _cut_short(start: int, head: Head, where: str) -> Finding:
    return Finding(seq=start - 1, check="anchor", repairable=True, message=(
        f"the write of seq {start}..{head.seq} announced {where} is not (fully) in the log: a crash mid-write "
        "(the next writing command repairs it and records trail_repaired) or a dropped tail"))
