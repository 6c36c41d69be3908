"""A real single-node SLURM cluster for the tests that submit jobs.

``slurm_cluster`` (session fixture) uses a cluster that already answers (``.ci/run`` starts
one with ``.ci/slurm-up``); otherwise it starts one itself with ``.ci/slurm-up`` and stops
exactly those daemons with ``.ci/slurm-down`` at the end. Where SLURM cannot start (not root,
no apt-get, a daemon that will not come up) the tests skip with slurm-up's own reason.
Nothing here mocks ``sbatch`` or ``squeue``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Cluster:
    partition: str
    gpus: int
    """Fake GPUs on the one node: a job asking for more is refused at submit."""


def answering() -> Cluster | None:
    """The default partition and GPU count of a cluster whose controller answers, else None."""
    if shutil.which("sinfo") is None:
        return None
    done = subprocess.run(["sinfo", "-h", "-o", "%P|%G|%T"], capture_output=True, text=True, timeout=30)
    lines = [line.split("|") for line in done.stdout.split()] if done.returncode == 0 else []
    for partition, gres, state in lines:
        if partition.endswith("*") and state == "idle":
            gpus = int(gres.split(":")[-1].split("(")[0]) if gres.startswith("gpu:") else 0
            return Cluster(partition=partition.rstrip("*"), gpus=gpus)
    return None


def start_own(pids_file: Path) -> Cluster:
    env = {**os.environ, "SLURM_PIDS_FILE": str(pids_file)}
    done = subprocess.run([str(ROOT / ".ci" / "slurm-up")], capture_output=True, text=True, env=env, timeout=600)
    cluster = answering() if done.returncode == 0 else None
    if cluster is None:
        reason = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        pytest.skip(f"SLURM cannot start on this machine: {reason}")
    return cluster


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    running = answering()
    if running is not None:
        yield running
        return
    pids_file = tmp_path_factory.mktemp("slurm") / "daemons.pids"
    try:
        yield start_own(pids_file)
    finally:
        if pids_file.exists():
            subprocess.run([str(ROOT / ".ci" / "slurm-down")], env={**os.environ, "SLURM_PIDS_FILE": str(pids_file)},
                           timeout=120, check=False)


def squeue_named(name: str) -> list[str]:
    """Every job the controller holds under ``name`` (any state), as ``id|state`` lines."""
    done = subprocess.run(["squeue", "--states=all", "-h", f"--name={name}", "-o", "%i|%T"], capture_output=True,
                          text=True, timeout=30, check=True)
    return done.stdout.split()


def sbatch_that_kills_its_caller(folder: Path) -> Path:
    """A folder for PATH whose ``sbatch`` submits through the real one, prints its answer, then kill -9s
    the caller when the id was asked for (--parsable): the crash between submit and record."""
    folder.mkdir()
    real = subprocess.run(["which", "sbatch"], capture_output=True, text=True, check=True).stdout.strip()
    (folder / "sbatch").write_text(f"#!/bin/bash\nout=$({real} \"$@\"); rc=$?\necho \"$out\"\n"
                                   "case \" $* \" in *' --parsable '*) kill -9 $PPID;; esac\nexit $rc\n")
    (folder / "sbatch").chmod(0o755)
    return folder
