"""Run a worker function against another checkout of the target (a git worktree).

``ctx.call`` always starts in the run's target checkout. A candidate is measured
against the stack it would join, so the same run needs two checkouts at once: the stack
tip and the candidate. ``run_in_checkout`` moves the worker into the checkout named by the
request (cwd and the front of ``sys.path``) before anything imports the target's code,
which is what makes ``import examples`` or ``import torchtitan`` resolve to that checkout.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict


class InCheckoutRequest(BaseModel):
    """Input of ``run_in_checkout``."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    checkout: str
    """Absolute path of the checkout to run in."""
    func: str
    """"pkg.mod:fn" of the wrapped worker function."""
    models: tuple[str, ...] = ()
    """Its request and answer models ("pkg.mod:Class"), as ``orchestrator.worker_main`` takes them."""
    request: dict[str, Any]


def enter_checkout(path: str | Path) -> Path:
    """Make ``path`` the cwd and the first entry of ``sys.path``; refuse once its code is imported.

    Raises:
        RuntimeError: a top-level package of the checkout was imported before the switch,
            so the process already holds another checkout's copy.
    """
    root = Path(path).resolve()
    packages = {p.name for p in root.iterdir() if (p / "__init__.py").is_file()}
    stale = sorted(name for name in packages if name in sys.modules
                   and not str(getattr(sys.modules[name], "__file__", "") or "").startswith(str(root)))
    if stale:
        raise RuntimeError(f"enter_checkout({root}): {stale} already imported from another checkout; "
                           "call run_in_checkout before importing the target's code")
    os.chdir(root)
    sys.path[:] = [str(root)] + [p for p in sys.path if p not in ("", ".", str(root))]
    return root


def run_in_checkout(request: Any) -> Any:
    """Worker entry: ``InCheckoutRequest`` in; the wrapped function's answer out."""
    from orchestrator.worker_main import call_function

    req = InCheckoutRequest.model_validate(request)
    enter_checkout(req.checkout)
    return call_function(req.func, {**req.request}, models=req.models)
