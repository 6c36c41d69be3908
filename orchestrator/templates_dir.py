"""Where the jinja2 templates live: one folder per workflow, one for the agent prompt.

A checkout keeps them in the top-level ``templates/``; the wheel ships that folder as the package
``orchestrator.templates`` (pyproject's package-dir mapping), so an install finds it beside this module.
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def templates_root() -> Path:
    """The installed ``orchestrator/templates`` when present, else the checkout's top-level ``templates/``."""
    installed = _HERE / "templates"
    return installed if installed.is_dir() else _HERE.parent / "templates"


def templates_dir(folder: str) -> Path:
    """``<root>/<folder>``: a workflow's (or the agent prompt's) templates."""
    return templates_root() / folder
