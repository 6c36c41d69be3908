"""CLI commands of the temporary-patch ledger: ``patch`` and ``revert-patches``."""

from __future__ import annotations

import sys
from typing import Any, Callable

import click


def register(main: click.Group, command: Callable) -> None:
    from orchestrator.cli import _print_outcome

    @command(main, "patch")
    @click.argument("run_id")
    @click.option("--file", "diff_file", required=True, type=click.Path(dir_okay=False, allow_dash=True),
                  help="Unified diff against the target ('-' reads stdin).")
    @click.option("--label", required=True, help="What the patch tests (names its row in the table).")
    def patch_cmd(settings: Any, run_id: str, diff_file: str, label: str) -> int:
        """Apply a temporary core patch to RUN's target, measure it, record the row."""
        from orchestrator.errors import UsageError
        from orchestrator.ledger import submit_patch

        try:
            diff = sys.stdin.read() if diff_file == "-" else open(diff_file, encoding="utf-8").read()
        except OSError as exc:
            raise UsageError(f"cannot read {diff_file}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise UsageError(f"{diff_file} is not UTF-8 text (byte {exc.start}); send the diff as UTF-8") from None
        return _print_outcome(settings, submit_patch(run_id, diff=diff, label=label, store=settings.store()))

    @command(main, "revert-patches")
    @click.argument("run_id")
    def revert_cmd(settings: Any, run_id: str) -> int:
        """Revert every open temporary patch of RUN and prove the files equal the base."""
        from orchestrator.ledger import revert_patches

        return _print_outcome(settings, revert_patches(run_id, store=settings.store()))
