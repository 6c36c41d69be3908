"""``survey --executor slurm``: the model types as one SLURM job array, chunks of types per task.

Each task runs the local survey on its chunk (one warm worker, one audited run per model in the
shared state dir; chunks are disjoint, so two tasks never write one run) into ``OUT/tasks/<i>/``.
The array's key is written to ``OUT/array.json`` before ``sbatch`` and its id after; the same
command looks the key up (``squeue``) before it would ever submit again, reports progress while
tasks run (exit 5), and once none is live merges the tasks' rows into the survey's reports.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path
from typing import Any, Callable

from orchestrator import cluster
from orchestrator.trail.store import atomic_write
from phases.add_moe_model.survey.runner import Survey, SurveyOptions
from phases.add_moe_model.survey.tasks import chunks_of, merge_tasks, task_dir, task_shell_line

WAITING = "waiting"


def run_array(opts: SurveyOptions, models: list[str], *, tasks: int, settings: cluster.Settings,
              say: Callable[[str], None]) -> Survey | str:
    """The merged survey once every task has ended, else the line saying what is still running."""
    path = opts.out / "array.json"
    record = json.loads(path.read_text()) if path.is_file() else None
    if record is None or record["models"] != models:
        record = submit_array(opts, models, tasks=tasks, settings=settings, path=path)
    elif not record.get("job_id"):
        found = cluster.lookup([record["key"]]).get(record["key"])
        record = save(path, {**record, "job_id": found.job_id.split("_")[0]}) if found else \
            submit_array(opts, models, tasks=tasks, settings=settings, path=path)
    tasks_now = cluster.lookup_all([record["key"]])
    live = [state for _, state in tasks_now if state.live]
    done = sum(1 for i in range(len(record["chunks"])) if (task_dir(opts.out, i) / "survey.json").is_file())
    if live:
        return (f"waiting (job): survey array {record['key']} (job {record['job_id']}): {len(live)} task(s) "
                f"pending or running, {done} of {len(record['chunks'])} wrote rows")
    say(f"survey array {record['key']} (job {record['job_id']}) ended; merging {len(record['chunks'])} task(s)")
    return merged(opts, record, {s.job_id: s for _, s in tasks_now})


def submit_array(opts: SurveyOptions, models: list[str], *, tasks: int, settings: cluster.Settings,
                 path: Path) -> dict[str, Any]:
    chunks = chunks_of(models, tasks)
    digest = hashlib.sha256(json.dumps([str(opts.out.resolve()), models]).encode()).hexdigest()[:10]
    attempt = 1 + (json.loads(path.read_text()).get("attempt", 0) if path.is_file() else 0)
    key = f"orch-survey-{digest}-a{attempt}"
    (opts.out / "tasks").mkdir(parents=True, exist_ok=True)
    script = opts.out / "array.sh"
    script.write_text(task_script(opts, chunks))
    record = save(path, {"key": key, "attempt": attempt, "models": models, "chunks": chunks, "job_id": ""})
    job_id = cluster.submit(settings, key=key, script=script, results_dir=opts.out / "tasks", gpus=0,
                            array=f"0-{len(chunks) - 1}")
    return save(path, {**record, "job_id": job_id})


def task_script(opts: SurveyOptions, chunks: list[list[str]]) -> str:
    from orchestrator.worker import PROJECT_ROOT

    lines = [f"  {i}) MODELS={shlex.quote(','.join(chunk))} ;;" for i, chunk in enumerate(chunks)]
    return ("#!/bin/bash\n# one task of the survey array: the local survey of this task's model types\n"
            f"cd {shlex.quote(PROJECT_ROOT)} || exit 2\ncase \"$SLURM_ARRAY_TASK_ID\" in\n" + "\n".join(lines)
            + "\n  *) exit 2 ;;\nesac\n" + task_shell_line(opts) + "\n")


def merged(opts: SurveyOptions, record: dict[str, Any], states: dict[str, cluster.JobState]) -> Survey:
    def ended(index: int) -> str:
        state = states.get(f"{record['job_id']}_{index}")
        return f"of job {record['job_id']} ended " + (f"{state.state} ({state.reason})" if state
                                                        else "(no longer in squeue)")

    return merge_tasks(opts.out, record["models"], record["chunks"], ended=ended)


def save(path: Path, record: dict[str, Any]) -> dict[str, Any]:
    atomic_write(path, json.dumps(record, indent=2).encode() + b"\n")
    return record
