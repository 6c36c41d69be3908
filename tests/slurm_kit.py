"""A real single-node SLURM cluster for the tests that submit jobs.

``slurm_session`` (registered once in conftest, so every module shares it) uses the cluster of
``.ci/slurm-up`` (its own config, state, ports and munge under ``SLURM_CI_ROOT``; clients reach it
through ``SLURM_CONF``, which the session sets): the one ``.ci/run`` started when it answers,
otherwise one it starts itself and stops exactly with ``.ci/slurm-down`` at the end. No test
ever talks to another cluster of the machine. ``slurm_cluster`` hands it to each test with the
node settled back to idle. Where SLURM cannot start (not root, no apt-get, a daemon that will
not come up) the tests skip with slurm-up's reason, and fail with it where CI provides SLURM.
Nothing here mocks ``sbatch`` or ``squeue``. ``controller_down`` stops the real slurmctld by
its PID and starts it again with ``.ci/slurm-up --controller``, which updates the PIDs file.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

import pytest

from tests.conftest import service_missing

ROOT = Path(__file__).resolve().parent.parent
SLURM_CI_ROOT = Path(os.environ.get("SLURM_CI_ROOT", "/run/orchestrator-slurm"))
CONF = SLURM_CI_ROOT / "etc" / "slurm.conf"


@dataclass(frozen=True)
class Cluster:
    partition: str
    gpus: int
    """Fake GPUs on the one node: a job asking for more is refused at submit."""
    pids_file: Path | None = None
    """slurm-up's record of the daemons it started (``SLURM_PIDS_FILE``), which slurm-down stops."""


def answering() -> Cluster | None:
    """The default partition and GPU count of a cluster whose controller answers, else None."""
    if shutil.which("sinfo") is None or not CONF.is_file():  # without its config sinfo looks for a controller in DNS
        return None
    try:
        done = subprocess.run(["sinfo", "-h", "-o", "%P|%G|%T"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return None
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
        service_missing("slurm", f"SLURM cannot start on this machine: {reason}")
    return cluster


@pytest.fixture(scope="session")
def slurm_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    os.environ["SLURM_CONF"] = str(CONF)  # sinfo, sbatch and the engine's cluster calls ask slurm-up's cluster only
    running = answering()
    if running is not None:
        yield replace(running, pids_file=Path(os.environ.get("SLURM_PIDS_FILE", SLURM_CI_ROOT / "daemons.pids")))
        return
    pids_file = tmp_path_factory.mktemp("slurm") / "daemons.pids"
    try:
        yield replace(start_own(pids_file), pids_file=pids_file)
    finally:
        if pids_file.exists():
            subprocess.run([str(ROOT / ".ci" / "slurm-down")], env={**os.environ, "SLURM_PIDS_FILE": str(pids_file)},
                           timeout=120, check=False)


@pytest.fixture
def slurm_cluster(slurm_session: Cluster) -> Cluster:
    """The session's cluster with its node idle: a test that drained it (a controller restart) does not
    decide the next test's outcome."""
    settle_node()
    return slurm_session


def node_states() -> dict[str, str]:
    done = subprocess.run(["sinfo", "-h", "-N", "-o", "%N|%T"], capture_output=True, text=True, timeout=30)
    return dict(line.split("|") for line in done.stdout.split())


def settle_node(limit_s: float = 180) -> None:
    """Wait until every node is idle for two seconds running, resuming drained ones as an administrator would.

    After a controller restart the old job's slurmstepd retries its completion for minutes and the
    controller may drain the node again after one resume; a node that does not settle fails the test.
    """
    deadline, idle_since = time.monotonic() + limit_s, None
    while time.monotonic() < deadline:
        states = node_states()
        drained = [node for node, state in states.items() if "drain" in state]
        for node in drained:
            subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], timeout=30, check=False)
        if states and all(state == "idle" for state in states.values()):
            idle_since = idle_since or time.monotonic()
            if time.monotonic() - idle_since >= 2:
                return
        else:
            idle_since = None
        time.sleep(0.5)
    pytest.fail(f"the SLURM node did not settle to idle in {limit_s:.0f} s: {node_states()}")


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


def recorded_pids(cluster: Cluster) -> dict[str, int]:
    """Daemon name -> PID, as slurm-up's PIDs file names them ({} without one)."""
    path = cluster.pids_file
    lines = path.read_text().splitlines() if path is not None and path.is_file() else []
    return {name: int(pid) for name, pid in (line.split() for line in lines if line.strip())}


def running_controller() -> int:
    path = SLURM_CI_ROOT / "run" / "slurmctld.pid"
    return int(path.read_text().strip() or 0) if path.is_file() else 0


def own_controller(cluster: Cluster) -> int:
    """The running slurmctld's PID when slurm-up started it (its PIDs file names it); else the test skips."""
    pid = recorded_pids(cluster).get("slurmctld", 0)
    if not pid or pid != running_controller():
        pytest.skip("the controller that answers was not started by .ci/slurm-up (its PIDs file does not name it)")
    return pid


@contextmanager
def controller_down(cluster: Cluster, *, sig: signal.Signals, then: str) -> Iterator[None]:
    """slurmctld stopped by its PID (SIGTERM: a stop, SIGKILL: a crash) for the body, then started again with
    ``.ci/slurm-up --controller THEN`` (``keep``: its saved state; ``clean``: none, as slurm-up starts it).

    Only a controller slurm-up started and its PIDs file names is touched; otherwise the test skips.
    """
    pid = own_controller(cluster)
    os.kill(pid, sig)
    deadline = time.monotonic() + 60
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        yield
    finally:
        env = {**os.environ, "SLURM_PIDS_FILE": str(cluster.pids_file)}
        subprocess.run([str(ROOT / ".ci" / "slurm-up"), "--controller", then], env=env, timeout=120, check=True,
                       capture_output=True, text=True)


def alive(pid: int) -> bool:
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def use_up_ids_through(job_id: str) -> None:
    """Submit (held) and cancel throwaway jobs until the controller hands out an id above ``job_id``.

    A controller that restarts from state older than a job forgets the job and hands its id out
    again, while the node may still hold the old job's step (slurmstepd retries its completion
    for minutes): a new job under that id is refused ('Duplicate jobid'), held, and the node
    drained. Tests after a crash must not meet that id.
    """
    for _ in range(100):
        done = subprocess.run(["sbatch", "--parsable", "--hold", "--job-name=kit-use-up-id", "--wrap", "true"],
                              capture_output=True, text=True, timeout=30)
        given = done.stdout.strip().split(";")[0]
        if done.returncode != 0 or not given.isdigit():
            return  # no controller to ask (the test failed with it down): nothing to use up
        subprocess.run(["scancel", "--name=kit-use-up-id", given], timeout=30, check=False)
        if int(given) > int(job_id):
            return


def logging_shims(folder: Path, log: Path, commands: tuple[str, ...]) -> Path:
    """A folder for PATH whose ``commands`` each log one line (``NAME PPID ARGS``) to ``log``, then run the real one."""
    folder.mkdir()
    for name in commands:
        real = shutil.which(name)
        (folder / name).write_text(f"#!/bin/bash\necho \"{name} $PPID $*\" >> {log}\nexec {real} \"$@\"\n")
        (folder / name).chmod(0o755)
    return folder
