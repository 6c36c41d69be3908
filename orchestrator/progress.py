"""Progress lines from a worker subprocess to the engine (stdlib only).

A worker writes ``@@progress <json>`` lines to stderr; the engine's worker runner shows
them on a terminal and keeps them in the worker log. Nothing here is recorded as an event.
"""

from __future__ import annotations

import json
import sys

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
