"""The hash chain's two rules, standard library only (readers must not need pydantic).

``canonical_json``: sorted keys, ``(",", ":")`` separators, UTF-8, NaN refused.
``hash = sha256(prev_hash + canonical_json(event without "hash" and "signed_head"))`` as hex.
``signed_head`` (the first line of each write of a run made with in-log heads, ``signed_log``)
is the signature over hashes, so it cannot be hashed itself; lines without it hash as always.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

SCHEMA_VERSION = 1
GENESIS_HASH = "0" * 64
SIGNED_HEAD = "signed_head"
_HASH_MEMBER = b',"hash":"'
_SIGNED_MEMBER = b',"signed_head":{'
_TS_MEMBER = b',"ts":"'
_AFTER_PHASE = ("prev_hash", "run_id", "schema_version", "seq", "ts", "type")
_ENVELOPE = frozenset({"actor", "data", "phase", *_AFTER_PHASE})
_HASH_MEMBER_LEN = len(_HASH_MEMBER) + 64 + 1


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
"""``json.dumps`` with the canonical options, built once (dumps builds an encoder per call)."""


def canonical_json(obj: Any) -> bytes:
    return _CANONICAL.encode(obj).encode("utf-8")


def chain_hash(prev_hash: str, event_without_hash: dict[str, Any]) -> str:
    if SIGNED_HEAD in event_without_hash:
        event_without_hash = {k: v for k, v in event_without_hash.items() if k != SIGNED_HEAD}
    return hashlib.sha256(prev_hash.encode("ascii") + canonical_json(event_without_hash)).hexdigest()


def event_line(prev_hash: str, event_without_hash: dict[str, Any]) -> tuple[str, bytes]:
    """The event's chain hash and its line as written (canonical JSON with ``"hash"``, then a newline).

    One serialization serves both, the hashed bytes and the line differing only by the ``"hash"``
    member (byte for byte what ``canonical_json`` of the whole event gives). An envelope as the
    writer makes it (exactly its keys, ``data`` the one container) is encoded once: ``"hash"``
    sorts between ``"data"`` and ``"phase"``, and no member after ``"phase"`` holds a container,
    so the last ``,"phase":`` of the hashed bytes is where it goes. Other events are dumped in two
    halves around it.
    """
    if event_without_hash.keys() == _ENVELOPE and not any(
            isinstance(event_without_hash[k], (dict, list)) for k in _AFTER_PHASE):
        body = canonical_json(event_without_hash)
        digest = hashlib.sha256(prev_hash.encode("ascii") + body).hexdigest()
        cut = body.rindex(b',"phase":')
        return digest, body[:cut] + b',"hash":"' + digest.encode("ascii") + b'"' + body[cut:] + b"\n"
    before = canonical_json({k: v for k, v in event_without_hash.items() if k < "hash"})[1:-1]
    after = canonical_json({k: v for k, v in event_without_hash.items() if k > "hash" and k != SIGNED_HEAD})[1:-1]
    digest = hashlib.sha256(prev_hash.encode("ascii") + b"{" + b",".join(filter(None, (before, after))) + b"}"
                            ).hexdigest()
    member = b'"hash":"' + digest.encode("ascii") + b'"'
    return digest, b"{" + b",".join(filter(None, (before, member, after))) + b"}\n"


def with_signed_head(line: bytes, member: bytes) -> bytes:
    """``line`` (as ``event_line`` made it) with the top-level ``"signed_head":<member>`` in its canonical place.

    It sorts between ``"seq"`` and ``"ts"``, and only ``"ts"`` and ``"type"`` (our own strings)
    follow it, so the last ``,"ts":"`` of the line is the top-level one.
    """
    cut = line.rindex(_TS_MEMBER)
    return line[:cut] + b',"signed_head":' + member + line[cut:]


def line_hash(prev_hash: str, line: bytes, *, signed: bool = False) -> str | None:
    """The chain hash of a line as written, without re-serializing it.

    The engine writes each line as the canonical JSON of the whole event, and ``"hash"``
    sorts right after ``"data"``, so cutting the top-level ``,"hash":"<64 hex>"`` member (and,
    when ``signed``, the last ``,"signed_head":{...}``, which holds no braces) out of the line gives
    the canonical bytes the hash covers. Returns None when the line does not have that shape
    (the caller then re-serializes).
    """
    cut = line.rfind(_HASH_MEMBER)
    if cut < 0:
        return None
    body = line[:cut] + line[cut + _HASH_MEMBER_LEN:]
    if signed:
        start = body.rfind(_SIGNED_MEMBER)
        end = body.find(b"}", start + len(_SIGNED_MEMBER))
        if start < 0 or end < 0:
            return None
        body = body[:start] + body[end + 1:]
    return hashlib.sha256(prev_hash.encode("ascii") + body).hexdigest()


def verified_prefix(events: list[dict[str, Any]], lines: list[bytes], *, run_id: str) -> int:
    """How many leading events are intact, judged from the raw lines (no re-serializing).

    The slow, explaining checks then start at the first event this cannot vouch for.
    """
    prev = GENESIS_HASH
    for index, (event, line) in enumerate(zip(events, lines)):
        try:
            intact = (event["seq"] == index and event["prev_hash"] == prev and event["run_id"] == run_id
                      and line_hash(prev, line, signed=SIGNED_HEAD in event) == event["hash"])
        except (KeyError, TypeError):
            intact = False
        if not intact:
            return index
        prev = event["hash"]
    return len(events)
