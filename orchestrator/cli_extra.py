"""CLI commands that take a submission (``submit`` and its aliases ``candidate`` and ``patch``) and
``revert-patches``. Every submission goes through ``engine.submit``: one row of the run's workflow table."""

from __future__ import annotations

import sys
from typing import Any, Callable

import click

from orchestrator.cli_base import parse_extra_options, print_outcome

_EXTRA = {"ignore_unknown_options": True, "allow_extra_args": True}


def register(main: click.Group, command: Callable) -> None:
    def submit(settings: Any, run_id: str, kind: str, args: dict[str, Any]) -> int:
        from orchestrator import engine

        outcome = engine.submit(run_id, kind, args, store=settings.store(), actor="human",
                                progress=settings.progress())
        return print_outcome(settings, outcome)

    @command(main, "submit", context_settings=_EXTRA)
    @click.argument("run_id")
    @click.argument("kind")
    def submit_cmd(settings: Any, run_id: str, kind: str) -> int:
        """Submit KIND (e.g. candidate, patch) to RUN; its fields follow as --field VALUE (see `explain`).

        A value that starts with "--" (a diff) goes as --field=VALUE.
        """
        return submit(settings, run_id, kind, parse_extra_options(click.get_current_context().args))

    @command(main, "candidate")
    @click.argument("run_id")
    @click.option("--branch", required=True, help="Branch of the run's target holding the rewrite.")
    @click.option("--label", required=True, help="Short name; it names the stack branch.")
    @click.option("--regions", default=None, help="Regions to enable with it, a,b or none (exactly these; a branch "
                  "whose changes touch regions the stack does not enable must name them).")
    def candidate_cmd(settings: Any, run_id: str, branch: str, label: str, regions: str | None) -> int:
        """Submit BRANCH of RUN's target as a candidate (= submit RUN candidate); measures it and rules on it."""
        named = {} if regions is None else {"regions": regions}
        return submit(settings, run_id, "candidate", {"branch": branch, "label": label, **named})

    @command(main, "patch")
    @click.argument("run_id")
    @click.option("--file", "diff_file", required=True, type=click.Path(dir_okay=False, allow_dash=True),
                  help="Unified diff against the target ('-' reads stdin).")
    @click.option("--label", required=True, help="What the patch tests (names its row in the table).")
    def patch_cmd(settings: Any, run_id: str, diff_file: str, label: str) -> int:
        """Apply a temporary core patch to RUN's target, measure it, record the row (= submit RUN patch)."""
        from orchestrator.errors import UsageError

        try:
            diff = sys.stdin.read() if diff_file == "-" else open(diff_file, encoding="utf-8").read()
        except OSError as exc:
            raise UsageError(f"cannot read {diff_file}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise UsageError(f"{diff_file} is not UTF-8 text (byte {exc.start}); send the diff as UTF-8") from None
        return submit(settings, run_id, "patch", {"diff": diff, "label": label})

    @command(main, "revert-patches")
    @click.argument("run_id")
    def revert_cmd(settings: Any, run_id: str) -> int:
        """Revert every open temporary patch of RUN and prove the files equal the base."""
        from orchestrator.ledger import revert_patches

        return print_outcome(settings, revert_patches(run_id, store=settings.store()))
