"""Progress lines from a worker subprocess to the engine (stdlib only).

A worker writes ``@@progress <json>`` lines to stderr; the engine's worker runner shows
them on a terminal and keeps them in the worker log. Nothing here is recorded as an event.
``Eta`` turns "step k of n" into a time left, for long loops of similar steps.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Callable

PREFIX = "@@progress "


def report(message: str, **fields: object) -> None:
    """Tell the engine what the worker is doing now (one short line)."""
    sys.stderr.write(PREFIX + json.dumps({"message": message, **fields}) + "\n")
    sys.stderr.flush()


def parse(line: str) -> str | None:
    """Return the message of a progress line, or None for ordinary output."""
    if not line.startswith(PREFIX):
        return None
    try:
        return str(json.loads(line[len(PREFIX):]).get("message", ""))
    except ValueError:
        return None


def pump_stream(stream: Any, log: bytearray, on_progress: Callable[[str], None] | None) -> None:
    """Copy a worker's output (a binary stream) into ``log`` line by line, showing its progress lines."""
    for raw in iter(stream.readline, b""):
        log += raw
        message = parse(raw.decode("utf-8", "replace").rstrip("\n"))
        if message is not None and on_progress is not None:
            on_progress(message)


class Eta:
    """Time left of ``total`` similar steps, estimated from the mean of the steps done so far."""

    def __init__(self, total: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.total = total
        self.done = 0
        self._clock = clock
        self._start = clock()

    def step_done(self) -> None:
        self.done += 1

    def describe(self) -> str:
        """E.g. "step 4 of 9, ETA 3m20s"; "ETA after the first step" before one has finished."""
        where = f"step {self.done + 1} of {self.total}"
        if not self.done:
            return f"{where}, ETA after the first step"
        left = (self._clock() - self._start) / self.done * (self.total - self.done)
        return f"{where}, ETA {format_seconds(left)}"


def format_seconds(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
