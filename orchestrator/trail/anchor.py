"""The trail's anchor outside the state dir: the chain head, signed with a key kept elsewhere.

The hash chain proves the lines agree with each other, not that they are the lines the engine
wrote: whoever can write ``events.jsonl`` can drop its tail, append a validly hashed event or
re-hash the whole chain (and rewrite run.json to match). So before every write the engine
records where the chain will stand afterwards in ``<anchor dir>/heads/<run_id>.<genesis>.json``:
``{prev: [seq, hash], seq, hash, mac}``, where ``mac`` is an HMAC-SHA256 under
``<anchor dir>/trail.key`` (32 random bytes, mode 0600, made on first use). The anchor dir is
``$ORCHESTRATOR_ANCHOR_DIR``, else ``$XDG_CONFIG_HOME/orchestrator``, else
``~/.config/orchestrator``: never inside a state dir. Written *before* the log, the anchor is
either the log's head or one write ahead of it (a write that did not land: the store repairs
that and records it). state/README.md has the threat model. Standard library only.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KEY_NAME = "trail.key"
KEY_BYTES = 32
RECORD_BYTES = 512


@dataclass(frozen=True, kw_only=True, slots=True)
class Head:
    seq: int
    hash: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Anchor:
    """The signed head: where the log stands (``head``) and stood before the last write (``prev``)."""

    head: Head
    prev: Head | None


class AnchorError(Exception):
    """The anchor is missing, unreadable or its MAC does not verify."""


def anchor_dir() -> Path:
    override = os.environ.get("ORCHESTRATOR_ANCHOR_DIR")
    if override:
        return Path(override)
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "orchestrator"


def load_key(*, create: bool) -> bytes | None:
    """The HMAC key; made (0600) when ``create`` and missing, else None when missing."""
    path = anchor_dir() / KEY_NAME
    if path in _KEYS:
        return _KEYS[path]
    key = _read_or_make_key(path, create=create)
    if key is not None:
        _KEYS[path] = key
    return key


_KEYS: dict[Path, bytes] = {}


def _read_or_make_key(path: Path, *, create: bool) -> bytes | None:
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        if not create:
            return None
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process made it first
            return path.read_bytes()
        with os.fdopen(fd, "wb") as handle:
            handle.write(os.urandom(KEY_BYTES))
            handle.flush()
            os.fsync(handle.fileno())
        return path.read_bytes()
    if len(key) != KEY_BYTES:
        raise AnchorError(f"{path} is not a {KEY_BYTES}-byte key")
    return key


def anchor_path(run_id: str, genesis: str) -> Path:
    return anchor_dir() / "heads" / f"{run_id}.{genesis[:16]}.json"


def _mac(key: bytes, run_id: str, genesis: str, head: Head, prev: Head | None) -> str:
    body = json.dumps([run_id, genesis, head.seq, head.hash, prev and [prev.seq, prev.hash]],
                      separators=(",", ":")).encode()
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def write_anchor(run_id: str, genesis: str, head: Head, prev: Head | None) -> None:
    """Record (fsynced) that the log is about to stand at ``head`` (one-off; OpenRun keeps a writer)."""
    writer = AnchorWriter(run_id, genesis)
    try:
        writer.write(head, prev)
    finally:
        writer.close()


class AnchorWriter:
    """Signs heads into one run's anchor file: made atomically once, then rewritten in place.

    Each record is padded to ``RECORD_BYTES`` and written with one ``pwrite`` at offset 0 plus
    ``fdatasync``: a torn record (power loss) fails its MAC, which refuses the run rather than
    trusting it.
    """

    def __init__(self, run_id: str, genesis: str) -> None:
        self.run_id, self.genesis = run_id, genesis
        self.path = anchor_path(run_id, genesis)
        self._key = load_key(create=True)
        self._fd: int | None = None

    def write(self, head: Head, prev: Head | None) -> None:
        assert self._key is not None
        record = json.dumps({"run_id": self.run_id, "genesis": self.genesis, "seq": head.seq, "hash": head.hash,
                             "prev": prev and [prev.seq, prev.hash],
                             "mac": _mac(self._key, self.run_id, self.genesis, head, prev)}).encode()
        record = record.ljust(RECORD_BYTES)
        if self._fd is None:
            if not self.path.exists():
                from orchestrator.trail.store import atomic_write

                self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                atomic_write(self.path, record)
                return
            self._fd = os.open(self.path, os.O_WRONLY)
        os.pwrite(self._fd, record, 0)
        os.fdatasync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_anchor(run_id: str, genesis: str) -> Anchor:
    """The verified anchor of a run; AnchorError saying what is wrong."""
    path = anchor_path(run_id, genesis)
    key = load_key(create=False)
    if key is None:
        raise AnchorError(f"no trail key at {path.parent.parent / KEY_NAME}: the trail's head cannot be checked")
    try:
        record: dict[str, Any] = json.loads(path.read_bytes())
        head = Head(seq=int(record["seq"]), hash=str(record["hash"]))
        prev = Head(seq=int(record["prev"][0]), hash=str(record["prev"][1])) if record["prev"] else None
        mac = str(record["mac"])
    except FileNotFoundError:
        raise AnchorError(f"no anchor {path} for this run: the log's head is vouched for by nothing outside "
                          "the state dir (the anchor was deleted, or the run was made with another anchor dir)"
                          ) from None
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        raise AnchorError(f"anchor {path} is malformed") from None
    if not hmac.compare_digest(mac, _mac(key, run_id, genesis, head, prev)):
        raise AnchorError(f"anchor {path} has a bad MAC: it was not written with this machine's trail key")
    return Anchor(head=head, prev=prev)
