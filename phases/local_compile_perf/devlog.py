"""The effort's devlog: one timestamped entry right after each measurement, decision, dead end.

``log(ctx, text)`` appends the entry as one ``note_added`` event: the trail is the devlog.
``artifacts/devlog.md`` is rendered from every note of the run (the agent's too) once per
phase, when it ends: each phase's ``run`` is wrapped in ``renders_devlog``.
"""

from __future__ import annotations

import functools
from typing import Callable

from orchestrator.phase_api import PhaseContext, PhaseResult

DEVLOG = "devlog.md"


def log(ctx: PhaseContext, text: str, *, kind: str = "devlog") -> None:
    """Append one devlog entry (kind: devlog, decision, dead_end, measurement, skill_feedback)."""
    ctx.note(text, kind=kind)


def render_devlog(ctx: PhaseContext) -> None:
    ctx.write_artifact(DEVLOG, ctx.render("devlog.md.j2", run_id=ctx.run_id, entries=ctx.notes()))


def renders_devlog(run: Callable[[PhaseContext], PhaseResult]) -> Callable[[PhaseContext], PhaseResult]:
    """Wrap a phase's ``run`` so devlog.md is rendered from the notes when the phase ends."""

    @functools.wraps(run)
    def run_and_render(ctx: PhaseContext) -> PhaseResult:
        try:
            return run(ctx)
        finally:
            render_devlog(ctx)

    return run_and_render
