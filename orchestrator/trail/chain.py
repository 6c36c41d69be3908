"""The hash chain's two rules, standard library only (readers must not need pydantic).

``canonical_json``: sorted keys, ``(",", ":")`` separators, UTF-8, NaN refused.
``hash = sha256(prev_hash + canonical_json(event without "hash"))`` as hex.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

SCHEMA_VERSION = 1
GENESIS_HASH = "0" * 64
_HASH_MEMBER = b',"hash":"'
_HASH_MEMBER_LEN = len(_HASH_MEMBER) + 64 + 1


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
"""``json.dumps`` with the canonical options, built once (dumps builds an encoder per call)."""


def canonical_json(obj: Any) -> bytes:
    return _CANONICAL.encode(obj).encode("utf-8")


def chain_hash(prev_hash: str, event_without_hash: dict[str, Any]) -> str:
    return hashlib.sha256(prev_hash.encode("ascii") + canonical_json(event_without_hash)).hexdigest()


def event_line(prev_hash: str, event_without_hash: dict[str, Any]) -> tuple[str, bytes]:
    """The event's chain hash and its line as written (canonical JSON with ``"hash"``, then a newline).

    One serialization serves both: the members whose keys sort before ``"hash"`` and those after
    it are dumped apart, so the hashed bytes and the line differ only by the ``"hash"`` member
    put between them (byte for byte what ``canonical_json`` of the whole event gives).
    """
    before = canonical_json({k: v for k, v in event_without_hash.items() if k < "hash"})[1:-1]
    after = canonical_json({k: v for k, v in event_without_hash.items() if k > "hash"})[1:-1]
    digest = hashlib.sha256(prev_hash.encode("ascii") + b"{" + b",".join(filter(None, (before, after))) + b"}"
                            ).hexdigest()
    member = b'"hash":"' + digest.encode("ascii") + b'"'
    return digest, b"{" + b",".join(filter(None, (before, member, after))) + b"}\n"


def line_hash(prev_hash: str, line: bytes) -> str | None:
    """The chain hash of a line as written, without re-serializing it.

    The engine writes each line as the canonical JSON of the whole event, and ``"hash"``
    sorts right after ``"data"``, so cutting the top-level ``,"hash":"<64 hex>"`` member out
    of the line gives the canonical bytes of the event without its hash. Returns None when
    the line does not have that shape (the caller then re-serializes).
    """
    cut = line.rfind(_HASH_MEMBER)
    if cut < 0:
        return None
    body = line[:cut] + line[cut + _HASH_MEMBER_LEN:]
    return hashlib.sha256(prev_hash.encode("ascii") + body).hexdigest()


def verified_prefix(events: list[dict[str, Any]], lines: list[bytes], *, run_id: str) -> int:
    """How many leading events are intact, judged from the raw lines (no re-serializing).

    The slow, explaining checks then start at the first event this cannot vouch for.
    """
    prev = GENESIS_HASH
    for index, (event, line) in enumerate(zip(events, lines)):
        try:
            intact = (event["seq"] == index and event["prev_hash"] == prev and event["run_id"] == run_id
                      and line_hash(prev, line) == event["hash"])
        except (KeyError, TypeError):
            intact = False
        if not intact:
            return index
        prev = event["hash"]
    return len(events)
