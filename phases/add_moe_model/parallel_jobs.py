"""``--executor slurm``: the parallelism rows this machine cannot run become one cluster job each.

A row's job is keyed ``orch-<run>-parallelism-<row>-a<attempt>`` (``orchestrator.jobs``: the key
is in the trail before ``sbatch``). Its script is the matrix's job script for that row alone; its
``<row>.log`` / ``<row>.rc`` come back through ``take_results`` when the engine sees the job end.
Here a row is WAITING while its job is in flight, UNRUN when the cluster refuses its GPU count
(``sbatch --test-only``), and FAIL with the job's end state as the cause (``cluster job TIMEOUT``)
when SLURM stopped the job (time limit, ``scancel``, node failure: its partial files are not taken
as the row's result, and a return code the trainer's SIGTERM left is no trainer failure) or the
job ended without writing the row's return code. The row's log so far and the job's output are
kept as ``parallelism/jobs/<row>.out``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from orchestrator import cluster, jobs
from orchestrator.phase_api import PhaseContext
from phases.add_moe_model.parallel_matrix import Row, base_record

WAITING = "WAITING"


def job_key_base(ctx: PhaseContext, row: Row) -> str:
    return f"orch-{ctx.run_id}-parallelism-{row.slug}"


def job_row(ctx: PhaseContext, row: Row, shown: str, *, script: Callable[[], str]) -> dict[str, Any]:
    """The row's record under the SLURM executor; submits its job at most once per attempt key."""
    base = job_key_base(ctx, row)
    job = jobs.current_job(ctx.state, base)
    record = base_record(row, shown)
    if job is not None and job["stage"] == "ended":
        return ended_row(ctx, row, record, job)
    settings = cluster.settings_from(ctx.options)
    if job is None:
        refused = cluster.refusal(settings, gpus=row.world_size)
        if refused:
            return {**record, "status": "UNRUN", "root_cause": "",
                    "error": f"the cluster refuses a {row.world_size}-GPU job: {refused}"}
    name = ctx.write_artifact(f"parallelism/jobs/{row.slug}.sh", script())
    root = ctx.scratch_dir / "jobs"
    root.mkdir(parents=True, exist_ok=True)
    job = jobs.ensure_submitted(ctx, settings, base=base, script=ctx.artifacts_dir / name, results_root=root,
                                gpus=row.world_size)
    if job["stage"] == "lost":
        return {**record, "status": "FAIL", "job": job_fields(job), "fixable": False, "error": job["error"],
                "root_cause": "the cluster did not take the job"}
    ctx.progress(f"{row.config}: waiting (job) {jobs.describe(job)}")
    return {**record, "status": WAITING, "job": job_fields(job), "error": f"waiting (job) {jobs.describe(job)}"}


def ended_row(ctx: PhaseContext, row: Row, record: dict[str, Any], job: dict[str, Any]) -> dict[str, Any]:
    """FAIL with the job's end state as the cause; reached only when the row's result was not taken from the job."""
    state, said = job["state"], f"{job.get('reason') or 'no reason given'}; read from {job.get('source') or 'squeue'}"
    how = (f"was stopped by SLURM: {state} ({said})" if state in cluster.STOPPED
           else f"ended {state} ({said}) with no return code written")
    return {**record, "status": "FAIL", "job": job_fields(job), "fixable": False, "log": kept_output(ctx, row, job),
            "error": f"job {job['key']} (id {job['job_id']}) {how}", "root_cause": f"cluster job {state}"}


def kept_output(ctx: PhaseContext, row: Row, job: dict[str, Any]) -> str | None:
    """The row's log so far and the job's output as one artifact; None when the job left neither."""
    folder = Path(job["results_dir"])
    parts = [folder / f"{row.slug}.log", folder / f"slurm-{job['job_id']}.out"]
    text = "".join(f"=== {p.name} ===\n{p.read_text(errors='replace')}\n" for p in parts if p.is_file())
    return ctx.write_artifact(f"parallelism/jobs/{row.slug}.out", text) if text else None


def job_fields(job: dict[str, Any]) -> dict[str, Any]:
    return {k: job.get(k) for k in ("key", "job_id", "state", "reason", "source")}


def waiting_summary(rows: list[dict[str, Any]]) -> str:
    return "waiting (job): " + ", ".join(f"{r['config']} {r['job']['key']} job {r['job']['job_id']}"
                                         for r in rows if r["status"] == WAITING)
