"""A one-phase workflow whose work is a real SLURM job (tests only): the engine's job path without torch.

``cluster`` writes a job script running ``--body`` and then ``echo ok > $RESULTS/result.txt``,
submits it through ``orchestrator.jobs`` (key in the trail before sbatch), and waits on it
(exit 5). When the engine sees the job end, ``take_results`` reads ``result.txt`` (the
``resume --results`` path); the re-run phase passes on that record, else fails with the job's end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from orchestrator import cluster, jobs
from orchestrator.errors import UsageError
from orchestrator.phase_api import HandBack, PhaseContext, PhaseResult
from orchestrator.workflow import PhaseSpec, Prepared, Workflow


class JobOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    target: str
    body: str = "true"
    gpus: int = 0


def prepare(options: JobOptions, state_dir: str, *, runner: Any = None) -> Prepared:
    cluster.check_ready(cluster.settings_from({}))
    return Prepared(target=str(Path(options.target).resolve()), options=options.model_dump(), answers={})


def run(ctx: PhaseContext) -> PhaseResult:
    base = f"orch-{ctx.run_id}-cluster"
    results = ctx.state["records"].get("job_result", [])
    if results:
        return PhaseResult(outcome="passed", summary=f"the job wrote {results[-1]['text']!r}")
    job = jobs.current_job(ctx.state, base)
    if job is not None and job["stage"] == "ended":
        return PhaseResult(outcome="failed", summary=f"job {job['key']} (id {job['job_id']}) ended {job['state']} "
                                                     f"({job.get('reason')}) with no result", data={"job": job})
    script = ctx.scratch_dir / "job.sh"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(f"#!/bin/bash\n{ctx.options['body']}\necho ok > \"$RESULTS/result.txt\"\n")
    job = jobs.ensure_submitted(ctx, cluster.settings_from({}), base=base, script=script,
                                results_root=ctx.scratch_dir / "jobs", gpus=ctx.options["gpus"])
    return PhaseResult(outcome="waiting_job", summary=f"waiting (job): {jobs.describe(job)}", data={"job": job})


def take_results(state: dict[str, Any], directory: Path) -> HandBack:
    result = directory / "result.txt"
    if not result.is_file():
        raise UsageError(f"{directory} has no result.txt")
    return HandBack(summary=f"job result from {directory}", records=(("job_result", {"text": result.read_text()}),))


WORKFLOW = Workflow(
    name="jobs",
    description="engine test workflow: one SLURM job",
    phases=(PhaseSpec(name="cluster", module="tests.jobflow", title="one cluster job",
                      results="tests.jobflow:take_results"),),
    options=JobOptions,
    prepare=prepare,
)
