"""The engine's cluster jobs against a real SLURM (tests/slurm_kit): wait, take back, fail, cancel, survive kill -9."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ROOT, TOY
from tests.slurm_kit import Cluster, sbatch_that_kills_its_caller, squeue_named

WORKFLOWS = f"{TOY},jobs=tests.jobflow:WORKFLOW"


def orch(*args: str, state_dir: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "orchestrator.cli", *args, "--state-dir", str(state_dir)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "ORCHESTRATOR_WORKFLOWS": WORKFLOWS, **(env or {})})


def start(state_dir: Path, toy_repo: Path, body: str) -> str:
    started = orch("start", "jobs", "--target", str(toy_repo), "--body", body, "--json", state_dir=state_dir)
    assert started.returncode == 0, started.stderr
    return json.loads(started.stdout)["run_id"]


def events(state_dir: Path, run_id: str) -> list[dict]:
    return [json.loads(line) for line in (state_dir / "runs" / run_id / "events.jsonl").read_text().splitlines()]


def job_records(state_dir: Path, run_id: str) -> list[dict]:
    return [e["data"]["record"] for e in events(state_dir, run_id)
            if e["type"] == "record_added" and e["data"]["kind"] == "job"]


def advance_until_settled(state_dir: Path, run_id: str, *, env: dict[str, str] | None = None,
                          limit_s: float = 90) -> subprocess.CompletedProcess:
    deadline = time.monotonic() + limit_s
    while True:
        done = orch("advance", run_id, state_dir=state_dir, env=env)
        if done.returncode != 5 or time.monotonic() > deadline:
            return done
        time.sleep(1)


def test_a_job_is_waited_on_and_its_results_taken_back_with_no_person(slurm_cluster, toy_repo, state_dir):
    run_id = start(state_dir, toy_repo, "sleep 2")
    first = orch("advance", run_id, state_dir=state_dir)
    assert first.returncode == 5, first.stderr
    key = f"orch-{run_id}-cluster-a1"
    [job] = squeue_named(key)
    job_id = job.split("|")[0]
    status = orch("status", run_id, state_dir=state_dir)
    assert "waiting (job)" in status.stdout and key in status.stdout and job_id in status.stdout, status.stdout
    assert any(line.startswith(f"job      {key} (job {job_id}): ") and line.split(": ")[1].split()[0] in
               ("PENDING", "RUNNING", "COMPLETING", "ENDED") for line in status.stdout.splitlines()), status.stdout
    done = advance_until_settled(state_dir, run_id)
    assert done.returncode == 0, done.stdout + done.stderr
    trail = events(state_dir, run_id)
    handed = [e for e in trail if e["type"] == "record_added" and e["data"]["kind"] == "job_result"]
    assert [(e["actor"], e["data"]["record"]["text"]) for e in handed] == [("engine", "ok\n")]
    assert [r["stage"] for r in job_records(state_dir, run_id)] == ["intent", "submitted", "ended"]
    assert orch("audit", run_id, "--no-anchor", state_dir=state_dir).returncode == 0


def test_a_cancelled_job_fails_the_phase_with_its_end_as_the_cause(slurm_cluster, toy_repo, state_dir):
    run_id = start(state_dir, toy_repo, "sleep 120")
    assert orch("advance", run_id, state_dir=state_dir).returncode == 5
    [job] = squeue_named(f"orch-{run_id}-cluster-a1")
    subprocess.run(["scancel", job.split("|")[0]], check=True)
    done = advance_until_settled(state_dir, run_id)
    assert done.returncode == 1, done.stdout + done.stderr
    state = json.loads(orch("status", run_id, "--json", state_dir=state_dir).stdout)
    assert "CANCELLED" in state["summary"], state["summary"]


def test_abort_cancels_the_runs_jobs(slurm_cluster, toy_repo, state_dir):
    run_id = start(state_dir, toy_repo, "sleep 120")
    assert orch("advance", run_id, state_dir=state_dir).returncode == 5
    key = f"orch-{run_id}-cluster-a1"
    assert orch("abort", run_id, "--reason", "test", state_dir=state_dir).returncode == 0
    deadline = time.monotonic() + 30
    while not all(j.endswith("|CANCELLED") for j in squeue_named(key)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert [j.split("|")[1] for j in squeue_named(key)] == ["CANCELLED"]


def test_kill_9_between_submit_and_record_leaves_one_job_and_the_run_completes(slurm_cluster, toy_repo, state_dir,
                                                                               tmp_path):
    shim = sbatch_that_kills_its_caller(tmp_path / "bin")
    run_id = start(state_dir, toy_repo, "sleep 2")
    killed = orch("advance", run_id, state_dir=state_dir, env={"PATH": f"{shim}:{os.environ['PATH']}"})
    assert killed.returncode == -9, killed.stderr
    key = f"orch-{run_id}-cluster-a1"
    assert [r["stage"] for r in job_records(state_dir, run_id)] == ["intent"]
    assert len(squeue_named(key)) == 1
    done = advance_until_settled(state_dir, run_id)
    assert done.returncode == 0, done.stdout + done.stderr
    stages = [(r["stage"], r.get("recovered", False)) for r in job_records(state_dir, run_id)]
    assert stages == [("intent", False), ("submitted", True), ("ended", False)]
    assert len(squeue_named(key)) == 1


def test_a_partition_the_cluster_refuses_or_missing_commands_exit_2_and_submit_nothing(slurm_cluster, toy_repo,
                                                                                      state_dir, tmp_path):
    refused = orch("start", "jobs", "--target", str(toy_repo), state_dir=state_dir,
                   env={"ORCHESTRATOR_SLURM_PARTITION": "no-such-partition"})
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "no-such-partition" in refused.stderr and "refuses" in refused.stderr
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    os.symlink(sys.executable, empty / "python")
    missing = orch("start", "jobs", "--target", str(toy_repo), state_dir=state_dir, env={"PATH": str(empty)})
    assert missing.returncode == 2 and "sbatch, squeue, scancel not found" in missing.stderr, missing.stderr
    assert not state_dir.exists()


def test_add_moe_model_refuses_an_unknown_executor_or_a_refused_partition_in_one_line(slurm_cluster, state_dir):
    unknown = orch("start", "add-moe-model", "--model", "Qwen/Qwen3-30B-A3B", "--executor", "pbs", state_dir=state_dir)
    assert unknown.returncode == 2 and "--executor" in unknown.stderr, unknown.stderr
    refused = orch("start", "add-moe-model", "--model", "Qwen/Qwen3-30B-A3B", "--executor", "slurm",
                   "--slurm-partition", "no-such-partition", state_dir=state_dir)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "no-such-partition" in refused.stderr
    assert not state_dir.exists()


def test_a_controller_that_does_not_answer_is_reported_and_nothing_is_concluded(slurm_cluster, toy_repo, state_dir,
                                                                                tmp_path):
    run_id = start(state_dir, toy_repo, "sleep 3")
    assert orch("advance", run_id, state_dir=state_dir).returncode == 5
    down = tmp_path / "bin"
    down.mkdir()
    (down / "squeue").write_text("#!/bin/bash\necho 'squeue: error: Unable to contact slurm controller' >&2\nexit 1\n")
    (down / "squeue").chmod(0o755)
    blind = orch("advance", run_id, state_dir=state_dir, env={"PATH": f"{down}:{os.environ['PATH']}"})
    assert blind.returncode == 5 and "squeue did not answer" in blind.stdout + blind.stderr, blind.stderr
    assert [r["stage"] for r in job_records(state_dir, run_id)] == ["intent", "submitted"]
    assert advance_until_settled(state_dir, run_id).returncode == 0
