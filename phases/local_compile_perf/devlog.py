"""The effort's devlog: one timestamped entry right after each measurement, decision, dead end.

``log(ctx, text)`` appends the entry to the trail twice over: a ``note_added`` event (what
the skill calls the devlog entry) and a ``devlog`` record in the snapshot, from which
``artifacts/devlog.md`` is rewritten at once, so the file never lags the trail.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

DEVLOG = "devlog.md"


def log(ctx: Any, text: str, *, kind: str = "devlog") -> None:
    """Append one devlog entry (kind: devlog, decision, dead_end, measurement) and rewrite devlog.md."""
    ts = datetime.now(timezone.utc).isoformat(timespec="seconds")
    ctx.note(text, kind=kind)
    ctx.add_record("devlog", {"ts": ts, "phase": ctx.phase, "kind": kind, "text": text})
    entries = ctx.state["records"].get("devlog", [])
    ctx.write_artifact(DEVLOG, ctx.render("lcp_devlog.md.j2", run_id=ctx.run_id, entries=entries))
