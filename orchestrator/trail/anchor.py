"""The trail's anchor outside the state dir: the chain head, signed.

The hash chain proves the lines agree with each other, not that they are the lines the engine
wrote: whoever can write ``events.jsonl`` can drop its tail, append a validly hashed event or
re-hash the whole chain (and rewrite run.json to match). So every write records where the chain
will stand afterwards in ``<anchor dir>/heads/<run_id>.<genesis>.json``:
``{prev: [seq, hash], seq, hash, sig, key}``, an Ed25519 signature by the key named in the run's
genesis event (``signing``). Runs made before that carry ``mac`` (legacy HMAC under
``trail.key``). Written before the log's lines, the anchor is the log's head or one write ahead
of it (a write that did not land: the store repairs that and records it); a run with in-log heads
(``signed_log``) carries the same signature in the log too, and its anchor may also lag after a
power loss (``writer``). A head record is public: copy it with the trail, or hand it to a
witness (``witness``). state/README.md has the threat model.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.trail import signing
from orchestrator.trail.signing import AnchorError, anchor_dir
from orchestrator.trail.trail_io import atomic_write

RECORD_BYTES = 512
__all__ = ["Anchor", "AnchorError", "AnchorWriter", "Head", "anchor_dir", "anchor_path", "read_anchor", "write_anchor"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Head:
    seq: int
    hash: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Anchor:
    """The signed head: where the log stands (``head``) and stood before the last write (``prev``)."""

    head: Head
    prev: Head | None
    signed_by: str
    """Whose key signed, in words (an Ed25519 key id and holder, or the legacy HMAC)."""


def anchor_path(run_id: str, genesis: str) -> Path:
    return signing.heads_dir() / f"{run_id}.{genesis[:16]}.json"


def signed_body(run_id: str, genesis: str, head: Head, prev: Head | None) -> bytes:
    return json.dumps([run_id, genesis, head.seq, head.hash, prev and [prev.seq, prev.hash]],
                      separators=(",", ":")).encode()


def head_record(run_id: str, genesis: str, head: Head, prev: Head | None, signer: dict[str, Any] | None) -> bytes:
    """The record for one head: Ed25519-signed when the run names a signer, else the legacy HMAC."""
    body = signed_body(run_id, genesis, head, prev)
    record: dict[str, Any] = {"run_id": run_id, "genesis": genesis, "seq": head.seq, "hash": head.hash,
                              "prev": prev and [prev.seq, prev.hash]}
    if signer is not None:
        record.update(sig=signing.sign(body), key=signer["public_key"])
    else:
        record["mac"] = signing.legacy_mac(body, create=True)
    return json.dumps(record).encode().ljust(RECORD_BYTES)


def write_anchor(run_id: str, genesis: str, head: Head, prev: Head | None, signer: dict[str, Any] | None) -> None:
    """Record (fsynced) that the log is about to stand at ``head`` (one-off; OpenRun keeps a writer)."""
    writer = AnchorWriter(run_id, genesis, signer)
    try:
        writer.write(head, prev)
    finally:
        writer.close()


class AnchorWriter:
    """Signs heads into one run's anchor file: made atomically once, then rewritten in place.

    Each record is padded to ``RECORD_BYTES`` and written with one ``pwrite`` at offset 0: the
    file's size and blocks never change after the first record, so a sync of it writes one block
    and no metadata. ``write(..., sync=True)`` adds that ``fdatasync`` to every record (runs whose
    heads live in the anchor alone); ``sync=False`` leaves it to ``close`` (runs with in-log heads,
    ``writer``). A torn record (power loss) fails its signature, which refuses the run rather than
    trusting it. The key is loaded once per writer, and each record is the bytes ``head_record``
    makes, formatted from the parts that stay fixed for the run (``_RecordFormat``).
    """

    def __init__(self, run_id: str, genesis: str, signer: dict[str, Any] | None) -> None:
        self.run_id, self.genesis, self.signer = run_id, genesis, signer
        self.path = anchor_path(run_id, genesis)
        self._fd: int | None = None
        self._unsynced = False
        self._format = _RecordFormat(run_id, genesis, signer)

    def sign(self, head: Head, prev: Head | None) -> str:
        """The Ed25519 signature (hex) of a head, as its record and its in-log copy carry it."""
        return self._format.sign(head, prev)

    def write(self, head: Head, prev: Head | None, *, sig: str | None = None, sync: bool = True) -> None:
        record = self._format.record(head, prev, sig)
        if self._fd is None:
            if not self.path.exists():
                self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                atomic_write(self.path, record)
                return
            self._fd = os.open(self.path, os.O_WRONLY)
        os.pwrite(self._fd, record, 0)
        if sync:
            os.fdatasync(self._fd)
        self._unsynced = not sync

    def close(self) -> None:
        if self._fd is not None:
            try:
                if self._unsynced:
                    os.fdatasync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = None


class _RecordFormat:
    """``head_record`` for one run without re-encoding what never changes (run id, genesis, key).

    Only seqs (ints) and our own hex hashes vary, so plain formatting gives the same bytes as
    ``json.dumps``; tests/test_trail_write_cost.py holds the two equal.
    """

    def __init__(self, run_id: str, genesis: str, signer: dict[str, Any] | None) -> None:
        self._body = json.dumps([run_id, genesis], separators=(",", ":"))[:-1] + ","
        self._head = json.dumps({"run_id": run_id, "genesis": genesis})[:-1] + ", "
        if signer is not None:
            self._sign = signing.signing_key().sign
            self._tail = ', "key": ' + json.dumps(signer["public_key"]) + "}"
        else:
            self._sign = None
            self._mac_key = signing.legacy_key(create=True)

    def body(self, head: Head, prev: Head | None) -> bytes:
        pair = "null" if prev is None else f'[{prev.seq},"{prev.hash}"]'
        return f'{self._body}{head.seq},"{head.hash}",{pair}]'.encode()

    def sign(self, head: Head, prev: Head | None) -> str:
        if self._sign is None:
            import hashlib
            import hmac

            return hmac.new(self._mac_key, self.body(head, prev), hashlib.sha256).hexdigest()
        return self._sign(self.body(head, prev)).hex()

    def record(self, head: Head, prev: Head | None, sig: str | None = None) -> bytes:
        """The padded record; ``sig`` when the caller signed already (it must be ``sign(head, prev)``)."""
        pair = "null" if prev is None else f'[{prev.seq}, "{prev.hash}"]'
        start = f'{self._head}"seq": {head.seq}, "hash": "{head.hash}", "prev": {pair}'
        sig = sig or self.sign(head, prev)
        record = f'{start}, "sig": "{sig}"{self._tail}' if self._sign is not None else f'{start}, "mac": "{sig}"}}'
        return record.encode().ljust(RECORD_BYTES)


def read_anchor(run_id: str, genesis: str, signer: dict[str, Any] | None) -> Anchor:
    """The verified anchor of a run; AnchorError saying what is wrong."""
    path = anchor_path(run_id, genesis)
    try:
        record = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise AnchorError(f"no anchor {path} for this run: the log's head is vouched for by nothing outside "
                          "the state dir (the anchor was deleted, or the run was made with another anchor dir)"
                          ) from None
    except (OSError, ValueError):
        raise AnchorError(f"anchor {path} is malformed") from None
    return verify_record(record, run_id, genesis, signer, where=f"anchor {path}")


def verify_record(record: Any, run_id: str, genesis: str, signer: dict[str, Any] | None, *, where: str) -> Anchor:
    """A head record checked against the run's genesis and its signer (the one anchor decision's input)."""
    try:
        head = Head(seq=int(record["seq"]), hash=str(record["hash"]))
        prev = Head(seq=int(record["prev"][0]), hash=str(record["prev"][1])) if record["prev"] else None
        if (record.get("run_id", run_id), record.get("genesis", genesis)) != (run_id, genesis):
            raise AnchorError(f"{where} is the head of another run")
    except (KeyError, TypeError, ValueError, IndexError):
        raise AnchorError(f"{where} is malformed") from None
    body = signed_body(run_id, genesis, head, prev)
    if signer is None:
        return Anchor(head=head, prev=prev, signed_by=_legacy(record, body, where))
    if "sig" not in record:
        raise AnchorError(f"{where} carries no Ed25519 signature, but the run's genesis names "
                          f"{signing.describe(signer)}")
    if record.get("key") != signer["public_key"]:
        raise AnchorError(f"{where} is signed by key {signing.key_id(str(record.get('key') or '00'))}, not by the "
                          f"run's {signing.describe(signer)} recorded at genesis")
    if not signing.verify(signer["public_key"], str(record["sig"]), body):
        raise AnchorError(f"{where} has a bad signature: {signing.describe(signer)} did not sign it")
    return Anchor(head=head, prev=prev, signed_by=signing.describe(signer))


def _legacy(record: dict[str, Any], body: bytes, where: str) -> str:
    import hmac

    path = anchor_dir() / signing.LEGACY_KEY_NAME
    if "mac" not in record:
        raise AnchorError(f"{where} is signed, but the run's genesis names no key")
    expected = signing.legacy_mac(body)
    if expected is None:
        raise AnchorError(f"no trail key at {path}: the head of this legacy (HMAC) run cannot be checked")
    if not hmac.compare_digest(str(record["mac"]), expected):
        raise AnchorError(f"{where} has a bad MAC: it was not written with this machine's trail key")
    return f"legacy HMAC (the secret {path})"
