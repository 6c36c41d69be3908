"""A parallelism row whose real SLURM job runs past its 1-minute limit: FAIL with TIMEOUT as its cause.

SLURM checks limits about every 30 s, so the job is stopped 60-90 s after it starts. Beside it
a row whose trainer fails (exit 3) at once: both are told apart from squeue, and again from the
files alone (the folders as squeue forgets them: ``MinJobAge`` later, or after a clean restart).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from orchestrator import jobs
from orchestrator.context import EngineContext
from orchestrator.git import capture_base
from orchestrator.trail.events import RunStarted
from orchestrator.trail.store import RunStore
from orchestrator.workflow import load_workflow
from phases.add_moe_model.parallel_jobs import WAITING, job_row
from phases.add_moe_model.parallel_matrix import Row, TrainerPaths
from phases.add_moe_model.parallelism import job_script
from tests.slurm_kit import Cluster


def stand_in(path: Path, body: str) -> str:
    path.write_text(f"#!/bin/bash\necho \"trainer started: $*\"\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_a_row_past_its_time_limit_fails_with_timeout_told_from_a_failure_by_squeue_and_by_its_files(
        slurm_cluster, toy_repo, state_dir, tmp_path):
    store = RunStore(state_dir)
    run_id = f"add-moe-model-slurm-timeout-{time.time_ns()}"
    options = {"model_id": "test/tiny", "executor": "slurm", "slurm_partition": slurm_cluster.partition,
               "slurm_time": "1"}
    store.create_run(run_id, RunStarted(workflow="add-moe-model", target=str(toy_repo), options=options,
                                        base=capture_base(toy_repo), initial_phase="parallelism"))
    paths = TrainerPaths(hf_config=str(tmp_path / "assets" / "hf_config"), tokenizer=str(tmp_path / "tok"),
                         dataset=str(tmp_path / "data"), dump=str(tmp_path / "dump"))
    slow, failing = Row(config="FSDP", world_size=1), Row(config="FSDP+EP", world_size=1, ep=1)
    trainers = {slow: stand_in(tmp_path / "slow-python", "sleep 300"), failing: stand_in(tmp_path / "bad-python",
                                                                                          "exit 3")}
    with store.open_run(run_id) as run:
        ctx = EngineContext(run, phase="parallelism", templates="add_moe_model", timeout_s=60,
                            on_progress=lambda _m: None)

        def settle(row: Row) -> dict:
            return job_row(ctx, row, "shown", script=lambda: job_script(ctx, paths, [row], python=trainers[row]))

        assert [settle(slow)["status"], settle(failing)["status"]] == [WAITING, WAITING]
        deadline = time.monotonic() + 150
        while jobs.collect(run, load_workflow("add-moe-model")) and time.monotonic() < deadline:
            time.sleep(2)
        timed_out = settle(slow)
        ended = {j["key"].split("-parallelism-")[1]: j for j in jobs.jobs_of(run.state).values()}
        log = (ctx.artifacts_dir / timed_out["log"]).read_text()
    assert timed_out["status"] == "FAIL" and timed_out["root_cause"] == "cluster job TIMEOUT", timed_out
    assert "stopped by SLURM: TIMEOUT (TimeLimit; read from squeue)" in timed_out["error"], timed_out["error"]
    assert timed_out["fixable"] is False and "trainer started" in log and "DUE TO TIME LIMIT" in log, log
    assert (ended["FSDP-a1"]["state"], ended["FSDP_EP-a1"]["state"]) == ("TIMEOUT", "FAILED")
    assert "parallelism_row" not in run.state["records"], "a stopped job's partial files are not its result"
    forgotten = {"records": {"job": [{**job, "stage": "submitted", "key": f"orch-forgotten-{time.time_ns()}-{name}",
                                      "results_dir": str(shutil.copytree(job["results_dir"], tmp_path / name))}
                                     for name, job in ended.items()]}}
    live, from_files = jobs.poll(forgotten)
    assert not live and [(e["state"], e["source"]) for e in from_files] == [
        ("TIMEOUT", f"slurm-{ended['FSDP-a1']['job_id']}.out"), ("FAILED", f"end-{ended['FSDP_EP-a1']['job_id']}.json")]
