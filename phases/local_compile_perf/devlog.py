"""The effort's devlog: one timestamped entry right after each measurement, decision, dead end.

``log(ctx, text)`` appends the entry as one ``note_added`` event: the trail is the devlog.
``artifacts/devlog.md`` is rendered from every note of the run (the agent's too) once per
phase, when it ends: ``render_devlog`` is the workflow's ``after_phase`` hook (one line in the table).
"""

from __future__ import annotations

from orchestrator.phase_api import PhaseContext

DEVLOG = "devlog.md"


def log(ctx: PhaseContext, text: str, *, kind: str = "devlog") -> None:
    """Append one devlog entry (kind: devlog, decision, dead_end, measurement, skill_feedback)."""
    ctx.note(text, kind=kind)


def render_devlog(ctx: PhaseContext) -> None:
    ctx.write_artifact(DEVLOG, ctx.render("devlog.md.j2", run_id=ctx.run_id, entries=ctx.notes()))
