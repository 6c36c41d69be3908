"""What a cluster job leaves in its results folder: the record of its end when the scheduler no longer has one.

``squeue`` forgets a job ``MinJobAge`` after it ends, and a controller that starts with empty
state forgets every job at once; ``sacct`` needs accounting. So every job the engine submits
runs its script through a wrapper (``orchestrator-job.sh``, written into the results folder)
that adds the job's own record of its end:

- ``end-<job>.json`` (``<job>`` as squeue writes it: ``N``, or ``N_i`` for an array task),
  written by the wrapper once the script has exited, atomically: the exit status. A job that
  SLURM stopped (time limit, ``scancel``, node failure, preemption) leaves none, since the
  wrapper is stopped with the script.
- ``slurm-<id>.out`` (``--output``): slurmstepd writes ``*** JOB N ON NODE CANCELLED AT T DUE TO
  TIME LIMIT ***`` (or ``PREEMPTION``, ``NODE FAILURE``, or no cause for ``scancel``) there when it
  stops a job, so TIMEOUT is told from a failure with no scheduler to ask.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

WRAPPER = "orchestrator-job.sh"
STOPPED_LINE = re.compile(r"\*\*\* JOB (\S+) ON (\S+) CANCELLED AT (\S+)(?: DUE TO ([A-Z ]+?))? \*\*\*")
CAUSES = {None: "CANCELLED", "TIME LIMIT": "TIMEOUT", "PREEMPTION": "PREEMPTED", "NODE FAILURE": "NODE_FAIL"}


def write_wrapper(script: Path, results_dir: Path) -> Path:
    """The script to hand ``sbatch``: ``script``'s own ``#SBATCH`` lines, then the script, then its end record."""
    path = results_dir / WRAPPER
    path.write_text(wrapper_text(script))
    return path


def wrapper_text(script: Path) -> str:
    lines = script.read_text().splitlines()
    interpreter = shlex.split(lines[0][2:]) if lines and lines[0].startswith("#!") else ["/bin/bash"]
    directives = []
    for line in lines[1:]:  # sbatch reads #SBATCH lines up to the first command, so do we
        if line.strip() and not line.startswith("#"):
            break
        if line.startswith("#SBATCH"):
            directives.append(line)
    return "\n".join([
        "#!/bin/bash", *directives,
        f"# orchestrator: run {script.resolve()},",
        "# then record its exit status in $RESULTS/end-<job>.json. A job SLURM stops (time limit, scancel,",
        "# node failure) writes none; slurmstepd's line in its output says why.",
        shlex.join([*interpreter, str(script.resolve())]),
        "rc=$?",
        'id=${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}; id=${id:-$SLURM_JOB_ID}',
        'printf \'{"job_id": "%s", "exit": %d, "restarts": %d}\\n\' "$id" "$rc" "${SLURM_RESTART_COUNT:-0}" '
        '> "$RESULTS/.end-$id.json" && mv -f "$RESULTS/.end-$id.json" "$RESULTS/end-$id.json"',
        "exit $rc", ""])


def own_end(results_dir: Path, job_id: str) -> dict[str, Any] | None:
    """How the job's script ended, from the ``end-<job>.json`` the wrapper wrote; None when there is none."""
    path = Path(results_dir) / f"end-{job_id}.json"
    try:
        code = int(json.loads(path.read_text())["exit"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return {"state": "COMPLETED" if code == 0 else "FAILED", "reason": f"its script exited {code}",
            "exit_code": f"{code}:0", "source": path.name}


def stopped_by_slurm(results_dir: Path, job_id: str) -> dict[str, Any] | None:
    """TIMEOUT, CANCELLED, PREEMPTED or NODE_FAIL from slurmstepd's line in the job's output; None without one."""
    path = Path(results_dir) / f"slurm-{job_id}.out"
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    found = list(STOPPED_LINE.finditer(text))
    if not found:
        return None
    line = found[-1]
    state = CAUSES.get(line.group(4), "CANCELLED")
    return {"state": state, "reason": f"slurmstepd: cancelled at {line.group(3)}"
            + (f" due to {line.group(4).lower()}" if line.group(4) else ""), "source": path.name}


def traces(results_dir: Path) -> list[str]:
    """Ids of the jobs that left files in ``results_dir`` (output or end record), newest first."""
    files = [p for p in Path(results_dir).glob("slurm-*.out")] + [p for p in Path(results_dir).glob("end-*.json")]
    files.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    return [p.stem.removeprefix("slurm-").removeprefix("end-") for p in files]
