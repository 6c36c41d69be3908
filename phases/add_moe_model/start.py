"""``start`` for add-moe-model: resolve MODEL, make or check the target, refuse bad input.

Everything here happens before the run exists, so a refusal (exit 2) leaves no run
directory; an embedded workspace made for a refused start is removed again.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from orchestrator.errors import UsageError
from orchestrator.git import capture_base
from orchestrator.worker import FRESH, Runner, run_worker
from orchestrator.workflow import Prepared
from phases.add_moe_model.model_source import ModelSourceError, resolve_model_source
from phases.add_moe_model.weights import check_model_type, read_weights_dir
from phases.add_moe_model.workspace import EXP, new_run_workspace

CHECK = "phases.add_moe_model.work.preflight:check_target"


def prepare(options: Any, state_dir: str, *, runner: Runner = FRESH) -> Prepared:
    slurm = executor_settings(options)
    try:
        source = resolve_model_source(options.model)
    except ModelSourceError as exc:
        raise UsageError(str(exc)) from None
    weights = read_weights_dir(options.weights) if options.weights else None
    if weights and source.model_type:
        check_model_type(weights, source.model_type)
    embedded = options.target == "embedded"
    target = new_run_workspace(Path(state_dir)) if embedded else Path(options.target).expanduser().resolve()
    try:
        check_checkout(target)
        model_type = check_worker(target, source.model_dump(mode="json"), python=options.python, runner=runner)
        if weights:
            check_model_type(weights, model_type)
    except BaseException:
        if embedded:
            shutil.rmtree(target, ignore_errors=True)
        raise
    chosen = (("branch", options.branch), ("commit", options.commit), ("unrun_rows", options.unrun_rows))
    answers = {k: v for k, v in chosen if v}
    recorded = {**options.model_dump(), **slurm, "target": str(target), "model_id": source.model_id,
                "model_type": source.model_type, "model_source": source.kind, "model_name": source.name,
                "model_name_source": source.name_source, "embedded": embedded,
                "weights": weights.path if weights else None}
    return Prepared(target=str(target), options=recorded, answers=answers)


def executor_settings(options: Any) -> dict[str, str]:
    """``--executor slurm``: the SLURM settings as resolved now (options, then environment), checked with
    the cluster before anything is made; refused in one line."""
    from orchestrator import cluster

    if options.executor != "slurm":
        return {}
    settings = cluster.settings_from(options.model_dump())
    cluster.check_ready(settings)
    return {f"slurm_{name}": getattr(settings, name) for name in cluster.SETTINGS}


def check_checkout(target: Path) -> None:
    """A git checkout of torchtitan with the transformers backend and a clean tree."""
    base = capture_base(target)
    if not (target / EXP).is_dir():
        raise UsageError(f"{target} has no {EXP}: pass the root of a torchtitan checkout that has the "
                         "transformers modeling backend (torchtitan >= 0.3.0)")
    if base["status"]:
        shown = ", ".join(line[3:] for line in base["status"][:5])
        raise UsageError(f"{target} has uncommitted changes ({shown}); commit or stash them so the run's base "
                         "is a clean tree")


def check_worker(target: Path, source: dict[str, Any], *, python: str | None, runner: Runner = FRESH) -> str:
    """The model's type as the target's transformers reads it; a refusal is a UsageError."""
    import sys

    result = run_worker(CHECK, {"source": source}, target=target, python=python or sys.executable, timeout_s=600,
                        runner=runner)
    if result.answer is None:
        tail = result.log.decode("utf-8", "replace").strip().splitlines()[-3:]
        raise UsageError(f"the target's Python could not check the model ({result.status}): " + " | ".join(tail))
    if not result.answer["ok"]:
        raise UsageError(result.answer["problem"], code=result.answer.get("code"))
    return result.answer["model_type"]
