"""``survey --jobs N``: the model types as N local processes side by side, one warm worker each.

Each task is the local survey of its chunk (``survey.tasks``) into ``OUT/tasks/<i>/`` with its
stderr in ``OUT/tasks/<i>.log``. The plan (models and chunks) is written to ``OUT/jobs.json``
before any task starts, and the same command run again reuses it: each task keeps its finished
rows and advances its interrupted run, exactly as one local survey does. The tasks die with this
process. Progress is the tasks' rows as they land, with an ETA.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from pathlib import Path
from typing import Callable

from orchestrator.trail.store import atomic_write
from phases.add_moe_model.survey.runner import Survey, SurveyOptions
from phases.add_moe_model.survey.tasks import chunks_of, merge_tasks, rows_done, task_command, task_dir

POLL_S = 2.0


def run_jobs(opts: SurveyOptions, models: list[str], *, jobs: int, say: Callable[[str], None]) -> Survey:
    from orchestrator.worker import PROJECT_ROOT
    from orchestrator.worker_main import die_with_parent

    chunks = plan(opts.out, models, jobs)
    (opts.out / "tasks").mkdir(parents=True, exist_ok=True)
    started, before = time.monotonic(), rows_done(opts.out, chunks)
    procs = []
    for index, chunk in enumerate(chunks):
        log = (opts.out / "tasks" / f"{index}.log").open("ab")
        command = task_command(opts, ",".join(chunk), str(task_dir(opts.out, index)))
        procs.append(subprocess.Popen(command, cwd=PROJECT_ROOT, stdout=subprocess.DEVNULL, stderr=log,
                                      preexec_fn=die_with_parent))
        log.close()
    say(f"{len(models)} model types in {len(chunks)} local task(s) side by side ({before} already surveyed); "
        f"logs in {opts.out / 'tasks'}")
    watch(procs, opts.out, chunks, total=len(models), before=before, started=started, say=say)
    codes = [p.returncode for p in procs]
    survey = merge_tasks(opts.out, models, chunks, ended=lambda i: f"ended with exit {codes[i]} (log tasks/{i}.log)")
    return dataclasses.replace(survey, seconds=round(time.monotonic() - started, 1))


def plan(out: Path, models: list[str], jobs: int) -> list[list[str]]:
    """The chunks this survey uses: the saved ones when the models are the same, else new ones."""
    path = out / "jobs.json"
    saved = json.loads(path.read_text()) if path.is_file() else {}
    if saved.get("models") == models and saved.get("jobs") == jobs:
        return saved["chunks"]
    chunks = chunks_of(models, jobs)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps({"models": models, "jobs": jobs, "chunks": chunks}, indent=2).encode() + b"\n")
    return chunks


def watch(procs: list[subprocess.Popen], out: Path, chunks: list[list[str]], *, total: int, before: int,
          started: float, say: Callable[[str], None]) -> None:
    shown = before
    while True:
        running = [p for p in procs if p.poll() is None]
        done = rows_done(out, chunks)
        if done != shown:
            rate = (time.monotonic() - started) / max(done - before, 1)
            eta = rate * (total - done) if done > before else 0.0
            say(f"[{done}/{total}] {len(running)} task(s) running; ETA {int(eta // 60)}m{int(eta % 60):02d}s")
            shown = done
        if not running:
            return
        time.sleep(POLL_S)
