"""A slurmctld restart while a run waits on its job: the real controller of tests/slurm_kit, stopped by its PID.

Two restarts. A crash (SIGKILL right after the job started) and a start again from the saved
state, as a cluster's restart does: that state predates the job's start, so the controller shows
the job PENDING again and would relaunch it although it has run (slurmd refuses it, drains the
node 'Duplicate jobid' and the job stays 'launch failed requeued held': before this engine read
the job's end record it waited on that forever), or even its submission, so the job is forgotten
and its id handed out again (which one SLURM's timing decides; tests/test_slurm_job_files.py builds
each). And a stop (SIGTERM) and a clean start as .ci/slurm-up does it (-c), which forgets every
job. Both times `advance` says the controller does not answer (exit 5) while it is down, the run
completes once it is back, from the job's own files, and the job was submitted once and its
script ran once.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.slurm_kit import (
    Cluster, controller_down, logging_shims, own_controller, recorded_pids, running_controller, settle_node,
    squeue_named, use_up_ids_through,
)
from tests.test_slurm_jobs import advance_until_settled, events, job_records, orch, start

RESTARTS = {"crash, then its saved state": (signal.SIGKILL, "keep"),
            "stop, then a clean start": (signal.SIGTERM, "clean")}


@pytest.mark.parametrize("restart", list(RESTARTS))
def test_a_controller_restart_mid_run_is_reported_then_survived_with_one_submission(slurm_cluster, toy_repo,
                                                                                     state_dir, tmp_path, restart):
    sig, then = RESTARTS[restart]
    own_controller(slurm_cluster)
    calls = tmp_path / "calls.log"
    env = {"PATH": f"{logging_shims(tmp_path / 'bin', calls, ('sbatch', 'sacct'))}:{os.environ['PATH']}"}
    run_id = start(state_dir, toy_repo, 'echo run >> "$RESULTS/runs.txt"; sleep 4')
    assert orch("advance", run_id, state_dir=state_dir, env=env).returncode == 5
    [intent, submitted] = job_records(state_dir, run_id)
    results, job_id, key = Path(intent["results_dir"]), submitted["job_id"], intent["key"]
    try:
        wait_for(results / "runs.txt")  # the job has started on the node
        with controller_down(slurm_cluster, sig=sig, then=then):
            blind = orch("advance", run_id, state_dir=state_dir, env=env)
            assert blind.returncode == 5, blind.stdout + blind.stderr
            assert "squeue did not answer" in blind.stdout + blind.stderr and "advance again" in blind.stderr
            assert [r["stage"] for r in job_records(state_dir, run_id)] == ["intent", "submitted"]
            wait_for(results / f"end-{job_id}.json")  # the job ended on slurmd while no controller ran
        pids = recorded_pids(slurm_cluster)
        assert pids["slurmctld"] == running_controller() and Path(f"/proc/{pids['slurmctld']}").exists()
        done = advance_until_settled(state_dir, run_id, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        ended = job_records(state_dir, run_id)[-1]
        assert ended["stage"] == "ended" and ended["state"] == "COMPLETED", ended
        # A controller restored from saved state learns the job's end from slurmd, or does not and the job's own
        # end record decides (SLURM's timing picks; tests/test_slurm_job_files.py builds each): both are true.
        assert ended["source"] in ("squeue", f"end-{job_id}.json"), ended
        deadline = time.monotonic() + 30
        while any(line.split("|")[1] in ("PENDING", "RUNNING") for line in squeue_named(key)):
            assert time.monotonic() < deadline, squeue_named(key)
            time.sleep(0.5)
    finally:
        settle_node()
        use_up_ids_through(job_id)
    logged = calls.read_text().splitlines()
    assert [c for c in logged if c.startswith("sbatch") and f"--job-name={key}" in c] and \
        len([c for c in logged if c.startswith("sbatch ")]) == 1, "submitted once"
    assert (results / "runs.txt").read_text() == "run\n", "its script ran once"
    per_command = [c.split()[1] for c in logged if c.startswith("sacct ")]
    assert all(per_command.count(p) == 1 for p in per_command), "sacct asked at most once per command"
    trail = json.dumps(events(state_dir, run_id))
    assert "sacct" not in trail and "accounting" not in trail, "its failure is recorded nowhere"
    assert orch("audit", run_id, "--no-anchor", state_dir=state_dir).returncode == 0


def wait_for(path: Path, limit_s: float = 60) -> None:
    deadline = time.monotonic() + limit_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.2)
