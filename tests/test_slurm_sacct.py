"""sacct as the engine reads it: real ``--parsable2`` output, the second look after squeue, and its silent failure.

No cluster needed: ``squeue`` and ``sacct`` here are scripts on PATH that print what the real
ones print. SACCT_OUTPUT is real: slurm 22.05.8 with slurmdbd and MariaDB on this CI node
(2026-12-02, the setup of /work/shared/reference/slurm.md §1.4), answering
``sacct -X --noheader --parsable2 --format=JobIDRaw,JobID,JobName,State,ExitCode,Reason
--name=... --starttime=...`` for a job that completed, one that exited 3, one cancelled by root,
one past its 1-minute limit and an array of two (task 0 under raw id 110, task 1 under the
array's own id); ``RUNNING_EARLIER`` is the limit job's line a minute before, while it ran.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import cluster, jobs

SACCT_OUTPUT = """\
104|104|sx-ok|COMPLETED|0:0|None
105|105|sx-fail|FAILED|3:0|None
106|106|sx-cancel|CANCELLED by 0|0:0|None
108|108|sx-to|TIMEOUT|0:0|None
110|107_0|sx-arr|COMPLETED|0:0|None
107|107_1|sx-arr|FAILED|1:0|None
"""
RUNNING_EARLIER = "108|108|sx-to|RUNNING|0:0|None\n"
DISABLED = "Slurm accounting storage is disabled"


def test_real_parsable2_lines_become_states_by_key_with_the_ids_squeue_uses():
    found = cluster.parse_sacct(SACCT_OUTPUT + "111|111|someone-else|COMPLETED|0:0|None\n",
                                ["sx-ok", "sx-fail", "sx-cancel", "sx-to", "sx-arr"])
    assert {k: [(s.job_id, s.state, s.reason, s.exit_code) for s in v] for k, v in found.items()} == {
        "sx-ok": [("104", "COMPLETED", "", "0:0")], "sx-fail": [("105", "FAILED", "", "3:0")],
        "sx-cancel": [("106", "CANCELLED", "by 0", "0:0")], "sx-to": [("108", "TIMEOUT", "", "0:0")],
        "sx-arr": [("107_0", "COMPLETED", "", "0:0"), ("107_1", "FAILED", "", "1:0")]}
    assert all(s.source == "sacct" and not s.live for v in found.values() for s in v)
    assert cluster.parse_sacct(RUNNING_EARLIER, ["sx-to"])["sx-to"][0].live


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """squeue that holds nothing (the jobs were forgotten) and sacct that answers ``text`` with ``rc``."""
    monkeypatch.setattr(cluster, "_sacct_failed", [])
    folder, calls = tmp_path / "bin", tmp_path / "sacct.calls"
    folder.mkdir()
    (folder / "squeue").write_text("#!/bin/bash\nexit 0\n")
    monkeypatch.setenv("PATH", f"{folder}:/usr/bin:/bin")

    def answer(text: str, *, rc: int = 0, stderr: str = "") -> Path:
        (folder / "answer.txt").write_text(text)
        (folder / "sacct").write_text(f"#!/bin/bash\necho \"$*\" >> {calls}\ncat {folder / 'answer.txt'}\n"
                                      f"{'echo ' + repr(stderr) + ' >&2' if stderr else ''}\nexit {rc}\n")
        for name in ("squeue", "sacct"):
            (folder / name).chmod(0o755)
        return calls
    return answer


def forgotten(tmp_path: Path, *pairs: tuple[str, str]) -> dict:
    return {"records": {"job": [{"key": key, "stage": "submitted", "job_id": job_id, "results_dir": str(tmp_path),
                                 "submitted_at": "2026-12-02T07:48:10"} for key, job_id in pairs]}}


def test_a_job_squeue_forgot_ends_as_sacct_says_where_accounting_works(fake_slurm, tmp_path):
    calls = fake_slurm(SACCT_OUTPUT)
    live, ended = jobs.poll(forgotten(tmp_path, ("sx-to", "108"), ("sx-arr", "107_0"), ("sx-ok", "999")))
    assert not live
    assert [(e["state"], e["source"]) for e in ended] == [("TIMEOUT", "sacct"), ("COMPLETED", "sacct"),
                                                         ("GONE", "none")], "another id under the key is not it"
    [line] = calls.read_text().splitlines()
    assert line == ("-X --noheader --parsable2 --format=JobIDRaw,JobID,JobName,State,ExitCode,Reason "
                    "--name=sx-to,sx-arr,sx-ok --starttime=2026-12-02T07:48:10")


def test_a_job_sacct_still_shows_running_is_left_to_its_files(fake_slurm, tmp_path):
    fake_slurm(RUNNING_EARLIER)  # sacct lags: an end it has not recorded yet is no end
    (tmp_path / "end-108.json").write_text('{"job_id": "108", "exit": 0, "restarts": 0}\n')
    [ended] = jobs.poll(forgotten(tmp_path, ("sx-to", "108")))[1]
    assert (ended["state"], ended["source"]) == ("COMPLETED", "end-108.json")


def test_without_accounting_sacct_fails_silently_once_per_process_and_is_no_job_end(fake_slurm, tmp_path, capfd):
    calls = fake_slurm("", rc=1, stderr=DISABLED)
    (tmp_path / "slurm-108.out").write_text("slurmstepd-vm: error: *** JOB 108 ON vm CANCELLED AT "
                                            "2026-12-02T07:32:41 DUE TO TIME LIMIT ***\n")
    first = jobs.poll(forgotten(tmp_path, ("sx-to", "108")))[1]
    again = jobs.poll(forgotten(tmp_path, ("sx-to", "108"), ("sx-ok", "104")))[1]
    assert [(e["state"], e["source"]) for e in first + again] == [
        ("TIMEOUT", "slurm-108.out"), ("TIMEOUT", "slurm-108.out"), ("GONE", "none")]
    assert len(calls.read_text().splitlines()) == 1, "asked once: its failure is remembered"
    assert cluster._sacct_failed == [DISABLED]
    assert "sacct" not in repr(first + again) and "accounting" not in repr(first + again)
    assert capfd.readouterr() == ("", ""), "silent"
