"""SLURM through its own commands (``sbatch``, ``squeue``, ``scancel``; ``sacct`` where it works): settings,
checks, submit, one poll.

Knows nothing of workflows: a job is a key (its ``--job-name``), a script, a results folder and a
GPU count. Settings come from options, else the environment (``ORCHESTRATOR_SLURM_PARTITION``,
``_ACCOUNT``, ``_TIME``, ``_SBATCH_ARGS``); nothing about a cluster is built in. Jobs are found by
key, never by id alone: ids restart when a controller starts with empty state. ``sacct`` is a
best-effort second look for jobs ``squeue`` has forgotten; without accounting (no slurmdbd) it
fails, and that failure is silent, asked once per process and never taken for a job's end.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import job_files
from orchestrator.errors import UsageError

COMMANDS = ("sbatch", "squeue", "scancel")
ENV = "ORCHESTRATOR_SLURM_"
SETTINGS = ("partition", "account", "time", "sbatch_args")
LIVE = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
                  "RESIZING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "PREEMPTED"})
"""squeue states of a job that may still write results (PREEMPTED jobs are requeued)."""
QUEUED = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
"""Live states of a job waiting to (re)start: one whose script has already ended is a relaunch."""
STOPPED = frozenset({"TIMEOUT", "CANCELLED", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "DEADLINE", "BOOT_FAIL",
                     "REVOKED"})
"""End states of a job SLURM stopped before its script ended: whatever it wrote is partial."""
TIMEOUT_S = 60
SACCT_TIMEOUT_S = 10
SACCT_FIELDS = ("JobIDRaw", "JobID", "JobName", "State", "ExitCode", "Reason")
_sacct_failed: list[str] = []
"""The first failure of ``sacct`` in this process (e.g. 'Slurm accounting storage is disabled'): not asked again."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    partition: str = ""
    account: str = ""
    time: str = ""
    sbatch_args: str = ""
    """Extra ``sbatch`` arguments, shell words (e.g. ``--qos=short --constraint=h100``)."""

    def args(self) -> list[str]:
        chosen = [f"--partition={self.partition}" if self.partition else "",
                  f"--account={self.account}" if self.account else "", f"--time={self.time}" if self.time else ""]
        return [a for a in chosen if a] + shlex.split(self.sbatch_args)


@dataclass(frozen=True, kw_only=True, slots=True)
class JobState:
    job_id: str
    state: str
    reason: str
    exit_code: str = ""
    source: str = "squeue"

    @property
    def live(self) -> bool:
        return self.state in LIVE


def settings_from(options: dict[str, Any]) -> Settings:
    """``slurm_<name>`` options first, then ``ORCHESTRATOR_SLURM_<NAME>``."""
    return Settings(**{name: options.get(f"slurm_{name}") or os.environ.get(ENV + name.upper(), "")
                       for name in SETTINGS})


def check_ready(settings: Settings) -> None:
    """UsageError (one line, nothing submitted) when the commands are missing or the cluster refuses the settings."""
    missing = [c for c in COMMANDS if shutil.which(c) is None]
    if missing:
        raise UsageError(f"--executor slurm: {', '.join(missing)} not found on PATH; install the SLURM client "
                         "commands or use --executor local")
    try:
        shlex.split(settings.sbatch_args)
    except ValueError as exc:
        raise UsageError(f"--slurm-sbatch-args {settings.sbatch_args!r}: {exc}") from None
    refused = refusal(settings, gpus=0)
    if refused:
        raise UsageError(f"--executor slurm: the cluster refuses these settings ({' '.join(settings.args())}): "
                         f"{refused}")


def refusal(settings: Settings, *, gpus: int) -> str:
    """Why the cluster would refuse a job of ``gpus`` GPUs on one node ('' when it would take it); submits nothing."""
    wanted = [f"--gpus-per-node={gpus}"] if gpus else []
    done = _run(["sbatch", "--test-only", "--nodes=1", *wanted, *settings.args(), "--wrap", "true"])
    if done.returncode == 0:
        return ""
    lines = [line.removeprefix("sbatch: error: ") for line in done.stderr.splitlines() if line.strip()]
    return (lines[-1] if lines else f"sbatch --test-only exit {done.returncode}").strip()


def submit(settings: Settings, *, key: str, script: Path, results_dir: Path, gpus: int, array: str = "") -> str:
    """``sbatch`` the script under ``key`` (job name and comment); its id. Results go to ``results_dir``.

    ``array``: a job array's index range (``0-7``), every task under the same key. The script runs
    through ``job_files``' wrapper, which records its end in ``results_dir``.
    """
    wrapper = job_files.write_wrapper(script, results_dir)
    wanted = ([f"--gpus-per-node={gpus}"] if gpus else []) + ([f"--array={array}"] if array else [])
    done = _run(["sbatch", "--parsable", f"--job-name={key}", f"--comment=orchestrator:{key}", "--nodes=1",
                 *wanted, *settings.args(), f"--output={results_dir}/slurm-%j.out",
                 f"--export=ALL,RESULTS={results_dir}", str(wrapper)])
    if done.returncode != 0:
        raise SubmitFailed(done.stderr.strip().splitlines()[-1:] or [f"sbatch exit {done.returncode}"])
    return done.stdout.strip().split(";")[0]


class SubmitFailed(Exception):
    """sbatch said no, or its answer was lost: the job may exist anyway, so look it up by key before retrying."""


def lookup(keys: list[str]) -> dict[str, JobState]:
    """The job the controller still holds under each of ``keys``: one ``squeue`` call."""
    return {name: state for name, state in lookup_all(keys)}


def lookup_all(keys: list[str]) -> list[tuple[str, JobState]]:
    """(key, state) of every job or array task the controller still holds under ``keys``: one ``squeue`` call."""
    if not keys:
        return []
    done = _run(["squeue", "--states=all", "-h", "-r", "-o", "%i|%j|%T|%r", f"--name={','.join(keys)}"])
    if done.returncode != 0:
        raise QueryFailed((done.stderr.strip().splitlines() or [f"squeue exit {done.returncode}"])[-1])
    found = []
    for line in done.stdout.splitlines():
        job_id, name, state, reason = (line.split("|") + ["", "", "", ""])[:4]
        if name in keys:
            found.append((name, JobState(job_id=job_id, state=state, reason=reason)))
    return found


class QueryFailed(Exception):
    """squeue did not answer (e.g. the controller is down): nothing can be concluded about any job."""


def accounted(keys: list[str], *, since: str) -> dict[str, list[JobState]]:
    """Best effort: what ``sacct`` holds under ``keys`` (jobs submitted after ``since``); {} where it does not work.

    One call. Missing, failing (no accounting), or failed before in this process: {} with no
    message and no retry, so a cluster without slurmdbd costs one ~20 ms call per command.
    """
    if not keys or _sacct_failed or shutil.which("sacct") is None:
        return {}
    done = _run(["sacct", "-X", "--noheader", "--parsable2", f"--format={','.join(SACCT_FIELDS)}",
                 f"--name={','.join(keys)}", f"--starttime={since}"], timeout=SACCT_TIMEOUT_S)
    if done.returncode != 0:
        _sacct_failed.append((done.stderr.strip().splitlines() or [f"sacct exit {done.returncode}"])[-1])
        return {}
    return parse_sacct(done.stdout, keys)


def parse_sacct(text: str, keys: list[str]) -> dict[str, list[JobState]]:
    """``sacct -X --noheader --parsable2 --format=JobIDRaw,JobID,JobName,State,ExitCode,Reason`` lines by key.

    ``JobID`` is squeue's form (``N``, ``N_i`` for an array task); ``State`` may carry more
    words (``CANCELLED by 0``), which go to the reason; a name not in ``keys`` (sacct's transient
    ``allocation``) is dropped.
    """
    found: dict[str, list[JobState]] = {}
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) != len(SACCT_FIELDS) or fields[2] not in keys:
            continue
        _raw, job_id, name, state, exit_code, reason = fields
        words = state.split()
        said = " ".join(w for w in [" ".join(words[1:]), "" if reason in ("", "None") else reason] if w)
        found.setdefault(name, []).append(JobState(job_id=job_id, state=(words or ["UNKNOWN"])[0].rstrip("+"),
                                                   reason=said, exit_code=exit_code, source="sacct"))
    return found


def cancel(jobs: list[tuple[str, str]]) -> None:
    """scancel each (key, id): the id only while it is still under its key (ids are reused after a clean restart)."""
    for key, job_id in jobs:
        _run(["scancel", f"--name={key}", job_id])


def _run(command: list[str], *, timeout: int = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(command, 124, "", f"{command[0]} timed out after {timeout} s")
