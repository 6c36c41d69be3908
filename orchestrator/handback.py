"""Work a phase handed out and a person (``resume --results DIR``) or a cluster job handed back.

The phase's ``results`` hook reads the directory into a ``HandBack`` (answers, artifacts,
records, a summary); nothing is written until the hook has accepted it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.context import phase_context
from orchestrator.errors import UsageError
from orchestrator.trail.writer import OpenRun
from orchestrator.workflow import DONE, load_workflow


def read_results(state: dict[str, Any], directory: Path) -> Any:
    """The current phase's ``HandBack`` for ``directory``; UsageError when it takes none (nothing written)."""
    from orchestrator.workflow import resolve_ref

    if state["phase"] == DONE:
        raise UsageError(f"run {state['run_id']} waits in no phase; it takes no results")
    spec = load_workflow(state["workflow"]).phase(state["phase"])
    if not spec.results:
        raise UsageError(f"phase {spec.name} of run {state['run_id']} takes no handed-back results")
    if not Path(directory).is_dir():
        raise UsageError(f"--results {directory}: not a directory")
    return resolve_ref(spec.results)(state, Path(directory))


def record_handback(run: OpenRun, handback: Any, *, workflow: Any, actor: str = "human") -> None:
    """Artifacts, records and a note of a hand-back, all as ``actor``'s (the engine's for a cluster job's)."""
    ctx = phase_context(run, workflow, actor=actor)
    for name, content in handback.artifacts.items():
        ctx.write_artifact(name, content)
    for kind, record in handback.records:
        ctx.add_record(kind, record)
    ctx.note(handback.summary, kind="results_handed_back")
