"""``orchestrator candidate RUN --branch B --label TEXT``: submit a rewrite for measurement."""

from __future__ import annotations

from typing import Any, Callable

import click


def register(main: click.Group, command: Callable[..., Any]) -> None:
    """Add the ``candidate`` command to the orchestrator CLI."""

    @command(main, "candidate")
    @click.argument("run_id")
    @click.option("--branch", required=True, help="Branch of the run's target holding the rewrite.")
    @click.option("--label", required=True, help="Short name; it names the stack branch.")
    @click.option("--regions", default="", help="Regions to enable with it (default: declared in its changed files).")
    def candidate_cmd(settings: Any, run_id: str, branch: str, label: str, regions: str) -> int:
        """Submit BRANCH of RUN's target as a candidate; measures it and rules on it."""
        from orchestrator.cli import _print_outcome
        from phases.local_compile_perf.candidates import submit_candidate

        outcome = submit_candidate(run_id, branch=branch, label=label, store=settings.store(), actor="human",
                                   tool_call_id=None, regions=tuple(r for r in regions.split(",") if r),
                                   progress=settings.progress())
        return _print_outcome(settings, outcome)
