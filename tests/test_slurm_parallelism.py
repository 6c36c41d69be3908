"""add-moe-model's parallelism rows under ``--executor slurm``, against the real cluster of tests/slurm_kit.

The row's job script is the real one (``sbatch.sh.j2`` for that row); the trainer in it is a
stand-in interpreter that logs what the job was given and exits 3, since the trainer itself
cannot run on this machine's torch (its FSDP probe fails at world size > 1).
"""

from __future__ import annotations

import time
from pathlib import Path

from orchestrator import cluster, jobs
from orchestrator.context import EngineContext
from orchestrator.git import capture_base
from orchestrator.trail.events import RunStarted
from orchestrator.trail.store import RunStore
from phases.add_moe_model.parallel_jobs import job_row
from phases.add_moe_model.parallel_matrix import Row, TrainerPaths
from phases.add_moe_model.parallelism import job_script
from tests.slurm_kit import Cluster, squeue_named


def test_rows_become_one_job_each_refused_sizes_stay_unrun(slurm_cluster, toy_repo, state_dir, tmp_path):
    store = RunStore(state_dir)
    run_id = f"add-moe-model-slurm-rows-{time.time_ns()}"
    options = {"model_id": "test/tiny", "executor": "slurm", "slurm_partition": slurm_cluster.partition}
    store.create_run(run_id, RunStarted(workflow="add-moe-model", target=str(toy_repo), options=options,
                                        base=capture_base(toy_repo), initial_phase="parallelism"))
    trainer = tmp_path / "stand-in-python"
    trainer.write_text("#!/bin/bash\necho \"gpus=$CUDA_VISIBLE_DEVICES args=$*\"\nexit 3\n")
    trainer.chmod(0o755)
    paths = TrainerPaths(hf_config=str(tmp_path / "assets" / "hf_config"), tokenizer=str(tmp_path / "tok"),
                         dataset=str(tmp_path / "data"), dump=str(tmp_path / "dump"))
    fits = Row(config="FSDP", world_size=slurm_cluster.gpus)
    too_wide = Row(config="FSDP+TP+EP", world_size=slurm_cluster.gpus * 2, tp=2, ep=slurm_cluster.gpus)
    with store.open_run(run_id) as run:
        ctx = EngineContext(run, phase="parallelism", templates="add_moe_model", timeout_s=60,
                            on_progress=lambda _m: None)

        def settle(row: Row) -> dict:
            return job_row(ctx, row, "shown", script=lambda: job_script(ctx, paths, [row], python=str(trainer)))

        refused = settle(too_wide)
        assert refused["status"] == "UNRUN" and "refuses" in refused["error"], refused
        waiting = settle(fits)
        key = f"orch-{run_id}-parallelism-FSDP-a1"
        assert waiting["status"] == "WAITING" and waiting["job"]["key"] == key and waiting["job"]["job_id"]
        assert settle(fits)["job"]["job_id"] == waiting["job"]["job_id"], "a recorded job is never submitted again"
        assert len(squeue_named(key)) == 1 and not squeue_named(f"orch-{run_id}-parallelism-FSDP_TP_EP-a1")
        deadline = time.monotonic() + 60
        while jobs.poll(run.state)[0] and time.monotonic() < deadline:
            time.sleep(0.5)
        results = Path(jobs.jobs_of(run.state)[key]["results_dir"])
        cancelled = cancelled_row(ctx, run, paths, tmp_path)
    assert cancelled["status"] == "FAIL" and cancelled["root_cause"] == "cluster job CANCELLED", cancelled
    assert "CANCELLED" in cancelled["error"] and cancelled["job"]["job_id"] in cancelled["error"]
    assert (results / "FSDP.rc").read_text().strip() == "3"
    log = (results / "FSDP.log").read_text()
    gpus = ",".join(str(i) for i in range(slurm_cluster.gpus))
    assert f"gpus={gpus}" in log and f"--nproc-per-node={slurm_cluster.gpus}" in log, log
    assert cluster.settings_from(options).partition == slurm_cluster.partition


def cancelled_row(ctx: EngineContext, run, paths: TrainerPaths, tmp_path: Path) -> dict:
    """A row whose job is cancelled before it writes a return code: FAIL with the job's end as the cause."""
    from orchestrator.workflow import load_workflow

    sleeper = tmp_path / "sleeping-python"
    sleeper.write_text("#!/bin/bash\nsleep 120\n")
    sleeper.chmod(0o755)
    row = Row(config="FSDP+EP", world_size=1)
    waiting = job_row(ctx, row, "shown", script=lambda: job_script(ctx, paths, [row], python=str(sleeper)))
    cluster.cancel([(waiting["job"]["key"], waiting["job"]["job_id"])])
    deadline = time.monotonic() + 60
    while jobs.collect(run, load_workflow("add-moe-model")) and time.monotonic() < deadline:
        time.sleep(0.5)
    return job_row(ctx, row, "shown", script=lambda: "unused: the job has ended")
