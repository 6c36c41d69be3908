"""A run's cluster jobs in its trail: the key is recorded before ``sbatch``, the id after, the end when seen.

Each job is a record of kind ``job`` (one per stage, merged by key):
- ``intent``: key, results folder, GPUs, submission time; written (fsynced) before ``sbatch`` runs;
- ``submitted``: the job id, after ``sbatch`` answered, or found again by key after a crash;
- ``ended``: the end state (COMPLETED, FAILED, CANCELLED, TIMEOUT, ...) and where it was read:
  ``squeue``, else ``sacct`` where accounting works, else the job's own files (``job_files``: its
  end record, slurmstepd's line in its output), else GONE. What a job SLURM stopped (TIMEOUT,
  CANCELLED, ...) wrote is not handed back: it is partial, and the phase reports the stop as the cause;
- ``lost``: an intent that left no trace (never accepted); the next attempt takes a new key.
Keys are ``<base>-a<attempt>``, so a crash between submit and record finds the job again
(``squeue --name=KEY``) instead of submitting twice. A job whose script has ended (its end
record) while squeue shows it queued again (a controller that crashed right after
starting it restarts from older state and relaunches it) is taken as ended, and the relaunch
is cancelled: its script never runs twice.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from orchestrator import cluster, job_files

JOB = "job"


class JobRecord(BaseModel):
    """One stage of a cluster job, a ``job`` record; ``jobs_of`` merges a key's stages into the job.

    The fields set depend on the stage (see the module docstring), hence the optional ones: ``intent``
    sets base, results_dir, gpus and submitted_at; ``submitted`` the job id (``recovered`` when found
    again by key); ``ended`` state, reason, source and at times exit_code and relaunched; ``lost`` error.
    A workflow that submits jobs declares this model for the kind in its table.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    """``<base>-a<attempt>``: the job's name in SLURM."""
    stage: Literal["intent", "submitted", "ended", "lost"]
    base: str | None = None
    results_dir: str | None = None
    gpus: int | None = None
    submitted_at: str | None = None
    job_id: str | None = None
    recovered: bool | None = None
    state: str | None = None
    """SLURM's end state (COMPLETED, FAILED, TIMEOUT, ...) or GONE."""
    reason: str | None = None
    source: str | None = None
    """Where the end was read: squeue, sacct, the job's own file, or "none"."""
    exit_code: str | None = None
    relaunched: str | None = None
    error: str | None = None


def jobs_of(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Key -> the job's stages merged, in trail order."""
    merged: dict[str, dict[str, Any]] = {}
    for record in state.get("records", {}).get(JOB, []):
        merged.setdefault(record["key"], {}).update(record)
    return merged


def current_key(state: dict[str, Any], base: str) -> str:
    lost = sum(1 for j in jobs_of(state).values() if j.get("base") == base and j["stage"] == "lost")
    return f"{base}-a{lost + 1}"


def current_job(state: dict[str, Any], base: str) -> dict[str, Any] | None:
    return jobs_of(state).get(current_key(state, base))


def ensure_submitted(ctx: Any, settings: cluster.Settings, *, base: str, script: Path, results_root: Path,
                     gpus: int) -> dict[str, Any]:
    """The job of ``base``: the recorded one, the one found by key after a crash, or a new submission.

    Its results folder is ``results_root/<key>``, on storage the compute nodes share.
    """
    key = current_key(ctx.state, base)
    known = jobs_of(ctx.state).get(key)
    if known and known.get("job_id"):
        return known
    if known and not recover(ctx, known):
        key = current_key(ctx.state, base)
    if jobs_of(ctx.state).get(key, {}).get("job_id"):
        return jobs_of(ctx.state)[key]
    results_dir = results_root / key
    results_dir.mkdir(parents=True, exist_ok=True)
    ctx.add_record(JOB, {"key": key, "base": base, "stage": "intent", "results_dir": str(results_dir), "gpus": gpus,
                         "submitted_at": time.strftime("%Y-%m-%dT%H:%M:%S")})
    try:
        job_id = cluster.submit(settings, key=key, script=script, results_dir=results_dir, gpus=gpus)
    except cluster.SubmitFailed as exc:
        if not recover(ctx, jobs_of(ctx.state)[key]):
            ctx.add_record(JOB, {"key": key, "stage": "lost", "error": f"sbatch: {' '.join(exc.args[0])}"})
        return jobs_of(ctx.state)[key]
    ctx.add_record(JOB, {"key": key, "stage": "submitted", "job_id": job_id})
    return jobs_of(ctx.state)[key]


def recover(ctx: Any, job: dict[str, Any]) -> bool:
    """An intent without an id: find the job by key (squeue, sacct, then its files); record it, or record it lost."""
    found = cluster.lookup([job["key"]]).get(job["key"])
    counted = [] if found else cluster.accounted([job["key"]], since=since([job])).get(job["key"], [])
    left = job_files.traces(Path(job["results_dir"]))
    job_id = found.job_id if found else counted[-1].job_id if counted else left[0] if left else ""
    if job_id:
        ctx.add_record(JOB, {"key": job["key"], "stage": "submitted", "job_id": job_id, "recovered": True})
        return True
    ctx.add_record(JOB, {"key": job["key"], "stage": "lost", "error": "no job under this key (never accepted)"})
    return False


def since(jobs: list[dict[str, Any]]) -> str:
    """sacct's ``--starttime`` for ``jobs``: the earliest intent (intents recorded without one: a week back)."""
    return min((j["submitted_at"] for j in jobs if j.get("submitted_at")), default="now-7days")


def open_jobs(state: dict[str, Any]) -> list[dict[str, Any]]:
    return [j for j in jobs_of(state).values() if j["stage"] == "submitted"]


def poll(state: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(still live, newly ended) among the open jobs, from one ``squeue`` call; QueryFailed when it cannot answer.

    A job squeue no longer holds under its key and id is looked up in sacct (one call for all,
    best effort), then in its files. An ended record that carries ``relaunched`` names a copy
    squeue still shows although the job's script ended: the caller cancels it.
    """
    waiting = open_jobs(state)
    seen = cluster.lookup([j["key"] for j in waiting])
    held = {j["key"]: seen[j["key"]] for j in waiting if j["key"] in seen and seen[j["key"]].job_id == j["job_id"]}
    forgotten = [j for j in waiting if j["key"] not in held]
    counted = cluster.accounted([j["key"] for j in forgotten], since=since(forgotten)) if forgotten else {}
    live, ended = [], []
    for job in waiting:
        told = held.get(job["key"]) or next((r for r in reversed(counted.get(job["key"], []))
                                             if r.job_id == job["job_id"] and not r.live), None)
        end = end_of(job, told)
        if end is None:
            live.append({**job, "state": told.state, "reason": told.reason})
        else:
            ended.append({"key": job["key"], "stage": "ended", **end})
    return live, ended


def end_of(job: dict[str, Any], told: cluster.JobState | None) -> dict[str, Any] | None:
    """How ``job`` ended (None: still live) from what squeue or sacct ``told`` and from its own files.

    The job's end record wins over a scheduler that shows it queued again or stopped: the script
    did end (a controller restarted from older state relaunches or fails what already ran). Unless
    slurmstepd's line in the job's output says it stopped the script: then the wrapper outlived the
    signal, and its record of a failed exit is the stop's echo, not the cause.
    """
    results_dir = Path(job["results_dir"])
    own = job_files.own_end(results_dir, job["job_id"])
    stop = job_files.stopped_by_slurm(results_dir, job["job_id"])
    if own is not None and own["state"] != "COMPLETED" and stop is not None:
        if told is not None and told.state in cluster.STOPPED:
            return told_end(told)
        return {**stop, "reason": f"{stop['reason']}; {own['reason'].removeprefix('its ')} after it"}
    if told is not None and told.live:  # RUNNING or COMPLETING with an end record: the job is just ending
        if own is None or told.state not in cluster.QUEUED:
            return None
        return {**own, "relaunched": f"{told.state} ({told.reason})",
                "reason": f"{own['reason']}; squeue shows it {told.state} again ({told.reason}): relaunched by a "
                          "controller restarted from older state"}
    if told is not None and (own is None or told.state not in cluster.STOPPED):
        return told_end(told)
    if own is not None:
        return {**own, "reason": own["reason"] + (f"; {told.source} says {told.state}" if told else "")}
    return stop or {
        "state": "GONE", "source": "none",
        "reason": "squeue no longer knows it and it left no end record: stopped before its script ended (e.g. by "
                  "a controller that restarted with empty state), or submitted before end records"}


def told_end(told: cluster.JobState) -> dict[str, Any]:
    """The end as squeue or sacct told it."""
    return {"state": told.state, "reason": told.reason, "source": told.source,
            **({"exit_code": told.exit_code} if told.exit_code else {})}


def cancel_open(state: dict[str, Any]) -> list[str]:
    """scancel every job of the run that has not ended; their ids."""
    jobs = [(j["key"], j["job_id"]) for j in open_jobs(state)]
    cluster.cancel(jobs)
    return [job_id for _, job_id in jobs]


def describe(job: dict[str, Any]) -> str:
    """``KEY (job ID, STATE)``; a job SLURM holds ('launch failed requeued held' after a refused launch) says so."""
    reason = job.get("reason") or ""
    held = f": {reason}; SLURM holds it until a person releases it" if "held" in reason.lower() else ""
    return f"{job['key']} (job {job.get('job_id') or '?'}{', ' + job['state'] if job.get('state') else ''}{held})"


def collect(run: Any, workflow: Any) -> str:
    """The engine's poll of a run waiting on jobs: '' once all ended (results handed back), else what it waits on.

    Ended jobs are recorded, and each one's results folder goes through the phase's ``results``
    hook, the path of ``resume --results``, as the engine's.
    """
    from orchestrator.trail import events as ev

    try:
        live, ended = poll(run.state)
    except cluster.QueryFailed as exc:
        return f"waiting (job): squeue did not answer ({exc}); run advance again once the controller is back"
    for record in ended:
        run.append(ev.RecordAdded(kind=JOB, record=record), phase=run.state["phase"])
        job = jobs_of(run.state)[record["key"]]
        if record["state"] not in cluster.STOPPED:  # what a stopped job wrote is partial: the phase reads its end
            hand_back(run, workflow, job)
        if record.get("relaunched"):
            cluster.cancel([(job["key"], job["job_id"])])
            run.append(ev.NoteAdded(kind="engine", text=f"scancel of {describe(job)}: squeue showed it "
                                    f"{record['relaunched']} after its script had ended"), phase=run.state["phase"])
    return ("waiting (job): " + ", ".join(describe(j) for j in live)) if live else ""


def hand_back(run: Any, workflow: Any, job: dict[str, Any]) -> None:
    from orchestrator.handback import read_results, record_handback
    from orchestrator.errors import UsageError

    try:
        handback = read_results(run.state, Path(job["results_dir"]))
    except UsageError:
        return  # the job left no results: the phase reads its end state instead
    record_handback(run, handback, workflow=workflow, actor="engine")


def seen_now(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's open jobs as squeue sees them now, for ``status`` (one call, writes nothing)."""
    waiting = open_jobs(state)
    try:
        seen = cluster.lookup([j["key"] for j in waiting])
    except cluster.QueryFailed as exc:
        return [{**job_fields(j), "state": "UNKNOWN", "reason": f"squeue did not answer: {exc}"} for j in waiting]
    gone = cluster.JobState(job_id="", state="ENDED", reason="no longer in squeue; advance takes its results")
    return [{**job_fields(j), "state": seen.get(j["key"], gone).state, "reason": seen.get(j["key"], gone).reason}
            for j in waiting]


def job_fields(job: dict[str, Any]) -> dict[str, Any]:
    return {"key": job["key"], "job_id": job.get("job_id")}
