"""Reading events.jsonl: complete lines, a torn tail, the last line of any size.

A line is complete when it ends with a newline; the bytes after the last newline are a torn
tail (a write that did not finish). Readers ignore a torn tail; the next writer repairs it
(``verify.open_verified``). Standard library plus orjson (fast parse of long trails).
"""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path
from typing import Any

from orchestrator.errors import TrailCorrupt

CHUNK = 1 << 16


def read_raw(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise TrailCorrupt(f"{path} is missing: the run's trail is gone; run `orchestrator audit` "
                           "or restore the file from a backup") from None


def split_lines(raw: bytes) -> tuple[list[bytes], bytes]:
    """(complete lines without their newline, torn tail)."""
    cut = raw.rfind(b"\n") + 1
    body, torn = raw[:cut], raw[cut:]
    lines = body.split(b"\n")
    lines.pop()  # the empty string after the final newline
    return lines, torn


def parse_lines(lines: list[bytes], path: Path) -> list[dict[str, Any]]:
    """Every line as a dict; TrailCorrupt naming the first line that is not a JSON object."""
    import orjson

    # NOTE: the parse builds millions of small containers; the cyclic GC would rescan them again
    # and again (most of the time of a long trail's parse) and finds no cycles.
    enabled = gc.isenabled()
    gc.disable()
    try:  # one parse of the whole log is much faster than a parse per line
        events = orjson.loads(b"[" + b",".join(lines) + b"]")
        if all(isinstance(e, dict) for e in events):
            return events
    except orjson.JSONDecodeError:
        pass
    finally:
        if enabled:
            gc.enable()
    for line_no, line in enumerate(lines, start=1):
        try:
            if not isinstance(json.loads(line), dict):
                raise ValueError("not an object")
        except ValueError as exc:
            raise TrailCorrupt(f"{path} line {line_no} is not a JSON event ({exc}); "
                               "run `orchestrator audit` for details") from None
    raise TrailCorrupt(f"{path} does not parse; run `orchestrator audit` for details")


def parse_trail(path: Path) -> list[dict[str, Any]]:
    """The complete events of a trail (a torn last line is ignored: a write that did not land)."""
    lines, _torn = split_lines(read_raw(path))
    if not lines:
        raise TrailCorrupt(f"{path} is empty: a run starts with a run_started event")
    return parse_lines(lines, path)


def last_line(path: Path) -> bytes | None:
    """The last complete line of the file, however long, reading backwards from the end."""
    try:
        handle = open(path, "rb")  # noqa: SIM115 (closed by the with below)
    except FileNotFoundError:
        raise TrailCorrupt(f"{path} is missing: the run's trail is gone") from None
    with handle:
        position = handle.seek(0, os.SEEK_END)
        tail = b""
        while position > 0:
            step = min(max(CHUNK, len(tail)), position)  # doubling: linear in the line's size
            position -= step
            handle.seek(position)
            tail = handle.read(step) + tail
            stop = tail.rfind(b"\n")
            if stop < 0:
                continue
            start = tail.rfind(b"\n", 0, stop)
            if start >= 0 or position == 0:
                return tail[start + 1:stop]
        return None
