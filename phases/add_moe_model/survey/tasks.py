"""A survey split into tasks: disjoint chunks of model types, each the local survey in ``OUT/tasks/<i>/``.

Shared by the two ways of fanning out (``--jobs N`` processes on this machine, ``--executor slurm``
as one job array): the chunks, where each task writes, and the merge of the tasks' rows into one
survey. Every model is still its own audited run in the shared state dir; chunks are disjoint, so
two tasks never write one run.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Callable

from phases.add_moe_model.survey.outcome import OUTCOMES, SurveyRow
from phases.add_moe_model.survey.runner import Survey, SurveyOptions, load_progress


def chunks_of(models: list[str], tasks: int) -> list[list[str]]:
    tasks = max(1, min(tasks, len(models)))
    return [models[i::tasks] for i in range(tasks)]


def task_dir(out: Path, index: int) -> Path:
    return out / "tasks" / str(index)


def task_command(opts: SurveyOptions, models: str, out: str) -> list[str]:
    """The local survey of one task (``models`` and ``out`` may be shell words such as "$MODELS")."""
    return [sys.executable, "-m", "orchestrator.cli", "survey", "add-moe-model", "--state-dir",
            str(opts.state_dir.resolve()), "--target", opts.target, "--device", opts.device,
            "--models", models, "--out", out]


def task_shell_line(opts: SurveyOptions) -> str:
    """``task_command`` for a job script that sets $MODELS and $SLURM_ARRAY_TASK_ID."""
    head = shlex.join(task_command(opts, "MODELS", "OUT")[:-4])
    return f'{head} --models "$MODELS" --out {shlex.quote(str(opts.out.resolve()))}/tasks/$SLURM_ARRAY_TASK_ID'


def rows_done(out: Path, chunks: list[list[str]]) -> int:
    return sum(len(load_progress(task_dir(out, i))["rows"]) for i in range(len(chunks)))


def merge_tasks(out: Path, models: list[str], chunks: list[list[str]], *,
                ended: Callable[[int], str]) -> Survey:
    """One survey of every task's rows; a model a task left no row for is an ``error`` row saying how
    the task ended (``ended(index)``)."""
    rows: dict[str, SurveyRow] = {}
    transformers, seconds, warm = "", 0.0, None
    for index, chunk in enumerate(chunks):
        found = {r.model_type: r for r in load_progress(task_dir(out, index))["rows"]}
        path = task_dir(out, index) / "survey.json"
        if path.is_file():
            body = json.loads(path.read_text())
            transformers = transformers or body.get("transformers", "")
            seconds = max(seconds, float(body.get("seconds") or 0))
            if body.get("warm_import_s") is not None:
                warm = max(warm or 0.0, float(body["warm_import_s"]))
        for model_type in chunk:
            rows[model_type] = found.get(model_type) or SurveyRow(
                model_type=model_type, model=f"type:{model_type}", outcome="error",
                reasons=[f"task {index} {ended(index)} without this model's row"])
    ordered = [rows[m] for m in models]
    counts = {o: sum(r.outcome == o for r in ordered) for o in OUTCOMES}
    return Survey(rows=ordered, counts=counts, transformers=transformers, seconds=seconds, warm_import_s=warm)
