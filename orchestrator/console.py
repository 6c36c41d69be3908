"""The console script ``orchestrator``: a plainly spelled ``status`` without click, every other command line
through click. It stands above ``cli_base`` (what commands share, without click) and ``cli`` (the click
commands), so neither imports the other back.
"""

from __future__ import annotations

import sys

from orchestrator.cli_base import run_plain_status


def entry() -> None:
    """A plain ``status`` runs here (and exits); any other command line goes to ``cli.main``."""
    run_plain_status(sys.argv[1:])
    from orchestrator.cli import main

    sys.exit(main())
