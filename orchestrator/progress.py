"""Progress lines from a worker subprocess to the engine, and from the engine to whoever shows them (stdlib only).

A worker writes ``@@progress <json>`` lines to stderr (``report``); a loop of known length says
which step runs (``step`` of ``total``, as ``Eta.report`` does). The engine's worker runner reads
them (``pump_stream``) and the phase's context turns each into an ``Update``: where the phase
stands in the steps it planned (its worker calls, ``ctx.plan``), counting a running worker's own
loop as a share of its step, and the time left from the mean of what finished. The CLI prints an
update as one line; the MCP server sends it as a progress notification (progress, total, message).
Nothing here is recorded as an event.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

PREFIX = "@@progress "


def report(message: str, *, step: int | None = None, total: int | None = None, **fields: object) -> None:
    """Tell the engine what the worker is doing now (one short line); ``step`` (from 1) of ``total``: where a loop
    of known length stands."""
    where = {"step": step, "total": total} if step is not None and total else {}
    sys.stderr.write(PREFIX + json.dumps({"message": message, **where, **fields}) + "\n")
    sys.stderr.flush()


class Line(str):
    """One progress line of a worker: the string is its message; ``step`` (from 1: the step of the worker's loop
    that runs now) of ``total`` where the line is a loop's, else None."""

    step: int | None
    total: int | None

    def __new__(cls, message: str, step: int | None = None, total: int | None = None) -> "Line":
        line = super().__new__(cls, message)
        line.step, line.total = step, total
        return line

    @property
    def message(self) -> str:
        return str(self)

    def share_done(self) -> float:
        """The finished share of the worker's loop (0 when the line says no step)."""
        if self.step is None or not self.total:
            return 0.0
        return min(max((self.step - 1) / self.total, 0.0), 1.0)


def parse(line: str) -> str | None:
    """The message of a progress line, or None for ordinary output."""
    found = parse_line(line)
    return None if found is None else found.message


def parse_line(line: str) -> Line | None:
    """The progress line in ``line``, or None for ordinary output."""
    if not line.startswith(PREFIX):
        return None
    try:
        body = json.loads(line[len(PREFIX):])
        step, total = body.get("step"), body.get("total")
        where = (step, total) if isinstance(step, int) and isinstance(total, int) and total > 0 else (None, None)
        return Line(str(body.get("message", "")), *where)
    except (ValueError, AttributeError):
        return None


def pump_stream(stream: Any, log: bytearray, on_progress: Callable[[Line], None] | None) -> None:
    """Copy a worker's output (a binary stream) into ``log`` line by line, handing on its progress lines."""
    for raw in iter(stream.readline, b""):
        log += raw
        line = parse_line(raw.decode("utf-8", "replace").rstrip("\n"))
        if line is not None and on_progress is not None:
            on_progress(line)


@dataclass(frozen=True, slots=True)
class Update:
    """A progress line as the engine hands it on: the phase's message and where the phase stands."""

    phase: str
    message: str
    done: float
    """Steps of the phase finished, the running worker's finished share of its loop included."""
    total: int | None
    """Steps the phase planned (``ctx.plan``: its worker calls); None where it cannot know them in advance."""
    eta_s: float | None
    """Seconds left: the mean time of a finished step times the steps left; None before anything finished."""

    def __str__(self) -> str:
        return f"{self.phase}: {self.message} | {self.where()}"

    def where(self) -> str:
        """E.g. "phase step 2 of 4, ETA 1m10s"; "phase step 1 of 1, ETA after the first step"; "phase step 3,
        total not known in advance"."""
        running = int(self.done) + 1 if self.total is None else min(int(self.done) + 1, self.total)
        if self.total is None:
            return f"phase step {running}, total not known in advance"
        if self.total == 0:
            return "phase step 0 of 0 (nothing to run), ETA 0s"
        eta = "ETA after the first step" if self.eta_s is None else f"ETA {format_seconds(self.eta_s)}"
        return f"phase step {running} of {self.total}, {eta}"

    def fields(self) -> dict[str, Any]:
        """What crosses a process boundary (the MCP server's call processes)."""
        return {"phase": self.phase, "message": self.message, "done": self.done, "total": self.total,
                "eta_s": self.eta_s, "text": str(self)}


class Steps:
    """Where one phase attempt stands in its planned steps (its worker calls)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.total: int | None = None
        self.finished = 0
        self._clock = clock
        self._start = clock()

    def plan(self, total: int) -> None:
        self.total = max(total, self.finished)

    def start_one(self) -> None:
        """A step begins: a phase that makes more calls than it planned grows its total instead of passing it."""
        if self.total is not None and self.finished >= self.total:
            self.total = self.finished + 1

    def finish_one(self) -> None:
        self.finished += 1

    def update(self, phase: str, message: str, within: Line | None = None) -> Update:
        done = self.finished + (within.share_done() if within else 0.0)
        eta = None
        if self.total is not None and done > 0:
            eta = max((self._clock() - self._start) / done * (self.total - done), 0.0)
        return Update(phase=phase, message=message, done=round(done, 4), total=self.total,
                      eta_s=None if eta is None else round(eta, 1))


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

    def report(self, message: str) -> None:
        """``report`` the message with where the loop stands, in words and as step/total."""
        report(f"{message} ({self.describe()})", step=min(self.done + 1, self.total), total=self.total)


def format_seconds(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
