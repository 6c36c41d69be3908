"""The hash chain's two rules, standard library only (readers must not need pydantic).

``canonical_json``: sorted keys, ``(",", ":")`` separators, UTF-8, NaN refused.
``hash = sha256(prev_hash + canonical_json(event without "hash" and "signed_head"))`` as hex.
``signed_head`` (the first line of each write of a run made with in-log heads, ``signed_log``)
is the signature over hashes, so it cannot be hashed itself; lines without it hash as always.
"""

from __future__ import annotations

import hashlib
import json
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

SCHEMA_VERSION = 1
GENESIS_HASH = "0" * 64
SIGNED_HEAD = "signed_head"
_HASH_MEMBER = b',"hash":"'
_SIGNED_MEMBER = b',"signed_head":{'
_TS_MEMBER = b',"ts":"'
_ENVELOPE = frozenset({"actor", "data", "phase", "prev_hash", "run_id", "schema_version", "seq", "ts", "type"})
_ENVELOPE_WHO = _ENVELOPE | {"who"}
"""The envelope of an event a person or an agent made: ``who`` records who it was (``identity``)."""
_HASH_MEMBER_LEN = len(_HASH_MEMBER) + 64 + 1


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
"""``json.dumps`` with the canonical options, built once (dumps builds an encoder per call)."""
_ENCODE = c_make_encoder and c_make_encoder(None, _CANONICAL.default, encode_basestring, None, ":", ",", True, False,
                                            False)


def canonical_json(obj: Any) -> bytes:
    return _CANONICAL.encode(obj).encode("utf-8")


def chain_hash(prev_hash: str, event_without_hash: dict[str, Any]) -> str:
    if SIGNED_HEAD in event_without_hash:
        event_without_hash = {k: v for k, v in event_without_hash.items() if k != SIGNED_HEAD}
    return hashlib.sha256(prev_hash.encode("ascii") + canonical_json(event_without_hash)).hexdigest()


def event_line(prev_hash: str, event_without_hash: dict[str, Any]) -> tuple[str, bytes]:
    """The event's chain hash and its line as written (canonical JSON with ``"hash"``, then a newline).

    For an envelope as the writer makes it, one serialization serves both: it is formatted around
    one encode of its ``data`` (``_envelope_parts``), and the hashed bytes and the line differ only
    by the ``"hash"`` member (byte for byte what ``canonical_json`` of the whole event gives).
    The parts stay text until the two encodes (what is hashed, the line): one per output, not per part.
    """
    parts = _envelope_parts(event_without_hash)
    if parts is None:
        digest = chain_hash(prev_hash, event_without_hash)
        return digest, canonical_json({**event_without_hash, "hash": digest}) + b"\n"
    before, after = parts
    digest = hashlib.sha256(prev_hash.encode("ascii") + (before + after).encode()).hexdigest()
    return digest, f'{before},"hash":"{digest}"{after}\n'.encode()


def _envelope_parts(event: dict[str, Any]) -> tuple[str, str] | None:
    """The canonical text before and after where ``"hash"`` goes, for an envelope of exactly the
    writer's keys (``who`` included or not: it sorts last) with int seqs and string members; None for
    anything else."""
    keys = event.keys()
    if (keys != _ENVELOPE and keys != _ENVELOPE_WHO) or type(event["seq"]) is not int \
            or type(event["schema_version"]) is not int:
        return None
    text = encode_basestring
    try:
        phase = "null" if event["phase"] is None else text(event["phase"])
        who = f',"who":{_data_text(event["who"])}' if "who" in event else ""
        before = f'{{"actor":{text(event["actor"])},"data":{_data_text(event["data"])}'
        after = (f',"phase":{phase},"prev_hash":{text(event["prev_hash"])},"run_id":{text(event["run_id"])},'
                 f'"schema_version":{event["schema_version"]},"seq":{event["seq"]},"ts":{text(event["ts"])},'
                 f'"type":{text(event["type"])}{who}}}')
    except TypeError:  # a member that is not a string where the envelope has one
        return None
    return before, after


def _data_text(data: Any) -> str:
    """``canonical_json(data)`` as text, through one C encoder made once (``json.dumps`` makes one per call).

    It keeps no circular-reference marks (a shared mark table would be wrong across threads), so a
    cycle ends in RecursionError: ``canonical_json`` then says what ``json.dumps`` says.
    """
    if _ENCODE is None:
        return _CANONICAL.encode(data)
    try:
        return "".join(_ENCODE(data, 0))
    except RecursionError:
        return _CANONICAL.encode(data)


def with_signed_head(line: bytes, member: bytes) -> bytes:
    """``line`` (as ``event_line`` made it) with the top-level ``"signed_head":<member>`` in its canonical place.

    It sorts between ``"seq"`` and ``"ts"``, and only ``"ts"``, ``"type"`` (our own strings) and
    ``"who"`` (no ``"ts"`` member; its strings are escaped) follow it, so the last ``,"ts":"`` of the
    line is the top-level one.
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
