"""A job's own record of its end (orchestrator/job_files) and how it weighs against the scheduler's word (jobs.end_of).

The real-cluster tests meet these cases when SLURM's timing gives them (a crash's saved state
either predates the job's start or its submission); here each is built once, deterministically.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from orchestrator import job_files, jobs
from orchestrator.cluster import JobState

STOPPED_LINE = "slurmstepd-vm: error: *** JOB 25 ON vm CANCELLED AT 2026-12-02T07:32:41 DUE TO TIME LIMIT ***\n"
"""As slurmstepd 22.05.8 wrote it into a real job's output on this CI node (a 1-minute limit)."""


def test_the_wrapper_keeps_the_scripts_sbatch_lines_runs_it_and_records_its_exit(tmp_path):
    script = tmp_path / "row.sh"
    script.write_text("#!/bin/bash\n# a row\n#SBATCH --time=01:00:00\n#SBATCH --gpus-per-node=2\n\necho hi\n"
                      "#SBATCH --not-a-directive-after-a-command\nexit 3\n")
    wrapper = job_files.write_wrapper(script, tmp_path)
    text = wrapper.read_text()
    assert "#SBATCH --time=01:00:00\n#SBATCH --gpus-per-node=2\n" in text and "--not-a-directive" not in text
    env = {"PATH": "/usr/bin:/bin", "RESULTS": str(tmp_path), "SLURM_JOB_ID": "42"}
    done = subprocess.run(["bash", str(wrapper)], capture_output=True, text=True, env=env)
    assert (done.returncode, done.stdout) == (3, "hi\n")
    assert job_files.own_end(tmp_path, "42") == {"state": "FAILED", "reason": "its script exited 3",
                                                 "exit_code": "3:0", "source": "end-42.json"}
    array = {**env, "SLURM_JOB_ID": "44", "SLURM_ARRAY_JOB_ID": "43", "SLURM_ARRAY_TASK_ID": "1"}
    subprocess.run(["bash", str(wrapper)], capture_output=True, env=array)
    assert job_files.own_end(tmp_path, "43_1")["state"] == "FAILED", "array tasks under squeue's N_i"
    assert not list(tmp_path.glob(".end-*")), "written atomically"


def test_slurmstepds_line_tells_a_time_limit_from_a_cancel_and_no_line_is_no_answer(tmp_path):
    (tmp_path / "slurm-25.out").write_text("=== FSDP ===\n" + STOPPED_LINE)
    (tmp_path / "slurm-26.out").write_text(STOPPED_LINE.replace("25", "26").replace(" DUE TO TIME LIMIT", ""))
    (tmp_path / "slurm-27.out").write_text("Traceback ...\nexit 1\n")
    assert job_files.stopped_by_slurm(tmp_path, "25")["state"] == "TIMEOUT"
    assert job_files.stopped_by_slurm(tmp_path, "26")["state"] == "CANCELLED"
    assert job_files.stopped_by_slurm(tmp_path, "27") is None and job_files.stopped_by_slurm(tmp_path, "28") is None


def job(tmp_path: Path, *, ended: bool) -> dict:
    if ended:
        (tmp_path / "end-7.json").write_text('{"job_id": "7", "exit": 0, "restarts": 0}\n')
    return {"key": "orch-x-a1", "job_id": "7", "results_dir": str(tmp_path)}


def test_the_jobs_end_record_wins_over_a_relaunch_or_a_stop_squeue_shows_and_a_job_ending_is_waited_on(tmp_path):
    held = JobState(job_id="7", state="PENDING", reason="launch failed requeued held")
    assert jobs.end_of(job(tmp_path / "a", ended=False), held) is None
    (tmp_path / "b").mkdir()
    relaunched = jobs.end_of(job(tmp_path / "b", ended=True), held)
    assert relaunched["state"] == "COMPLETED" and relaunched["relaunched"] == "PENDING (launch failed requeued held)"
    failed_by_confusion = jobs.end_of(job(tmp_path / "b", ended=True), JobState(job_id="7", state="NODE_FAIL",
                                                                              reason=""))
    assert failed_by_confusion["state"] == "COMPLETED" and "squeue says NODE_FAIL" in failed_by_confusion["reason"]
    assert jobs.end_of(job(tmp_path / "b", ended=True), JobState(job_id="7", state="COMPLETING", reason="")) is None
    oom = jobs.end_of(job(tmp_path, ended=False), JobState(job_id="7", state="OUT_OF_MEMORY", reason="OutOfMemory"))
    assert (oom["state"], oom["source"]) == ("OUT_OF_MEMORY", "squeue")
    assert jobs.end_of(job(tmp_path, ended=False), None)["state"] == "GONE"


def test_a_held_job_says_a_person_must_release_it():
    said = jobs.describe({"key": "k", "job_id": "131", "state": "PENDING", "reason": "launch failed requeued held"})
    assert said == "k (job 131, PENDING: launch failed requeued held; SLURM holds it until a person releases it)"
    assert jobs.describe({"key": "k", "job_id": "9", "state": "PENDING", "reason": "Resources"}) == "k (job 9, PENDING)"


def test_a_time_limit_the_wrapper_outlived_is_a_timeout_not_the_scripts_failure(tmp_path):
    """Seen in a full suite on a loaded CI node: slurmstepd stopped the script at its limit, the wrapper outlived
    the signal and recorded the script's exit 1, and the row read FAILED instead of TIMEOUT."""
    (tmp_path / "slurm-7.out").write_text("=== FSDP ===\n" + STOPPED_LINE.replace("25", "7") + "Terminated\n")
    (tmp_path / "end-7.json").write_text('{"job_id": "7", "exit": 1, "restarts": 0}\n')
    told = JobState(job_id="7", state="TIMEOUT", reason="TimeLimit")
    job_7 = {"key": "orch-x-a1", "job_id": "7", "results_dir": str(tmp_path)}
    from_squeue = jobs.end_of(job_7, told)
    assert (from_squeue["state"], from_squeue["source"]) == ("TIMEOUT", "squeue")
    from_files = jobs.end_of(job_7, None)
    assert (from_files["state"], from_files["source"]) == ("TIMEOUT", "slurm-7.out")
    assert "exited 1 after" in from_files["reason"]
