"""Reading events.jsonl: complete lines, a torn tail, the last line of any size.

A line is complete when it ends with a newline; the bytes after the last newline are a torn
tail (a write that did not finish). Readers ignore a torn tail; the next writer repairs it
(``store.open_run`` on the inspector's answer). Standard library plus orjson (fast parse of long trails).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
from pathlib import Path
from typing import Any

from orchestrator.errors import TrailCorrupt

CHUNK = 1 << 16
EVENTS = "events.jsonl"
SNAPSHOT = "run.json"
ARTIFACTS = "artifacts"


def resolved_path(recorded: str, state_dir: str | Path) -> str:
    """A path the trail recorded, read back: relative ones (inside the state dir, e.g. an embedded workspace) are
    joined to the state dir they are read from; absolute ones (runs made before, targets elsewhere) stay."""
    return recorded if not recorded or os.path.isabs(recorded) else os.path.join(state_dir, recorded)


def atomic_write(path: Path, content: bytes) -> None:
    """Write ``content`` to ``path`` so that readers see the old or the new file, never half."""
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


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


def parse_events(lines: list[bytes]) -> tuple[list[dict[str, Any]], list[str]]:
    """Every line as a dict, and one problem per line that is not a JSON object (the one parser)."""
    import orjson

    # NOTE: the parse builds millions of small containers; the cyclic GC would rescan them again
    # and again (most of the time of a long trail's parse) and finds no cycles.
    enabled = gc.isenabled()
    gc.disable()
    try:  # one parse of the whole log is much faster than a parse per line
        events = orjson.loads(b"[" + b",".join(lines) + b"]")
        if all(isinstance(e, dict) for e in events):
            return events, []
    except orjson.JSONDecodeError:
        pass
    finally:
        if enabled:
            gc.enable()
    events, problems = [], []
    for line_no, line in enumerate(lines, start=1):
        try:
            event = json.loads(line)
            if not isinstance(event, dict):
                raise ValueError("not an object")
            events.append(event)
        except ValueError as exc:
            problems.append(f"line {line_no} is not a JSON event ({exc})")
    return events, problems


def parse_lines(lines: list[bytes], path: Path) -> list[dict[str, Any]]:
    """Every line as a dict; TrailCorrupt naming the first line that is not a JSON object."""
    events, problems = parse_events(lines)
    if problems:
        raise TrailCorrupt(f"{path} {problems[0]}; run `orchestrator audit` for details")
    return events


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
