"""Reliability: crashes at random points, torn writes, big events, broken runs, signals, races.

Real CLI processes against real git repos and the toy workflow (no torch, so cheap).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import git
import pytest

from orchestrator import engine
from orchestrator.trail import events as ev
from orchestrator.trail.store import RunStore
from tests.conftest import ROOT, cli, make_repo
from tests.reliability_kit import alive, cli_proc, events, kill_group, wait_for, worker_pids

CRASH_RUNS = 10
SEED = 20261130


def toy_run(tmp_path: Path, name: str, **options: str) -> tuple[Path, str]:
    """A toy run (color answered by a person) whose fix is already in place: advance runs it to done."""
    target = tmp_path / f"{name}-target"
    make_repo(target, {"a.txt": "hello\n", "allowed/README": "edit here\n"})
    (target / "allowed" / "fixed.txt").write_text("ok\n")
    state = tmp_path / f"{name}-state"
    run_id = engine.start("toy", {"target": str(target), "color": "red", **options}, store=RunStore(state)).run_id
    return state, run_id


def passed_counts(state: Path, run_id: str) -> Counter:
    return Counter(e["phase"] for e in events(state, run_id)
                   if e["type"] == "phase_completed" and e["data"]["outcome"] == "passed")


def finishes_clean(state: Path, run_id: str) -> bool:
    """One more advance (unless it finished before the kill) ends the run; no phase passed twice; audit clean."""
    status = cli("status", run_id, "--json", state_dir=state)
    if json.loads(status.stdout)["status"] != "done":
        status = cli("advance", run_id, "--json", state_dir=state)
    done = status.returncode == 0 and json.loads(status.stdout)["status"] == "done"
    once = set(passed_counts(state, run_id).values()) == {1}
    return done and once and cli("audit", run_id, state_dir=state).returncode == 0


def test_kill_9_at_random_points_of_advance(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    held = []
    for index in range(CRASH_RUNS):
        state, run_id = toy_run(tmp_path, f"r{index}")
        proc = cli_proc("advance", run_id, state_dir=state)
        time.sleep(rng.uniform(0.2, 1.8))
        kill_group(proc)
        held.append(finishes_clean(state, run_id))
    assert all(held), f"{sum(held)} of {CRASH_RUNS} held"


CRASH_WRITE = """
import os, sys
from orchestrator import engine
from orchestrator.trail import events as ev
from orchestrator.trail.store import RunStore

real = os.write
mode = sys.argv[3]

def crash(fd, data):
    blob = bytes(data)
    if mode == "half" or (mode == "batch" and b'"transition_taken"' in blob):
        cut = len(blob) // 2 if mode == "half" else blob.index(b"\\n") + 1
        real(fd, blob[:cut])
        os._exit(9)
    return real(fd, data)

store = RunStore(sys.argv[1])
if mode == "half":
    with store.open_run(sys.argv[2]) as run:
        os.write = crash
        run.append_many([ev.NoteAdded(kind="devlog", text="small"), ev.NoteAdded(kind="devlog", text="y" * 200000)])
else:
    os.write = crash
    engine.advance(sys.argv[2], store=store)
"""


def crash_in_write(state: Path, run_id: str, mode: str) -> None:
    proc = subprocess.run([sys.executable, "-c", CRASH_WRITE, str(state), run_id, mode], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr


def test_torn_write_is_readable_then_repaired_with_a_record(tmp_path: Path) -> None:
    state, run_id = toy_run(tmp_path, "torn")
    crash_in_write(state, run_id, "half")
    raw = (state / "runs" / run_id / "events.jsonl").read_bytes()
    assert not raw.endswith(b"\n")
    assert cli("status", run_id, state_dir=state).returncode == 0
    assert cli("list", state_dir=state).returncode == 0
    assert cli("show", run_id, state_dir=state).returncode == 0
    assert cli("audit", run_id, state_dir=state).returncode == 1  # the torn line is reported until repaired
    assert finishes_clean(state, run_id)
    repaired = [e["data"] for e in events(state, run_id) if e["type"] == "trail_repaired"]
    assert len(repaired) == 1 and repaired[0]["dropped_lines"] == 1 and repaired[0]["torn_bytes"] > 0


def test_completion_and_transition_land_together(tmp_path: Path) -> None:
    state, run_id = toy_run(tmp_path, "batch")
    crash_in_write(state, run_id, "batch")  # the completion's line is written, the transition's is not
    types = [e["type"] for e in events(state, run_id)]
    assert types[-1] == "phase_completed"
    assert finishes_clean(state, run_id)
    trail = events(state, run_id)
    repaired = [e for e in trail if e["type"] == "trail_repaired"]
    assert len(repaired) == 1 and repaired[0]["data"]["dropped_lines"] == 1
    for index, event in enumerate(trail):  # every passed completion is followed at once by its transition
        if event["type"] == "phase_completed" and event["data"]["outcome"] == "passed":
            assert trail[index + 1]["type"] == "transition_taken"


def test_reads_work_for_an_event_of_any_size(tmp_path: Path) -> None:
    state, run_id = toy_run(tmp_path, "big")
    with RunStore(state).open_run(run_id) as run:
        run.append(ev.NoteAdded(kind="devlog", text="z" * 300_000))
    for args in (("status", run_id), ("show", run_id), ("list",), ("status",)):
        assert cli(*args, state_dir=state).returncode in (0, 3), args
    status = json.loads(cli("status", run_id, "--json", state_dir=state).stdout)
    assert status["last_seq"] == len(events(state, run_id)) - 1


def test_list_survives_a_broken_run(tmp_path: Path) -> None:
    state, good = toy_run(tmp_path, "list")
    bad = engine.start("toy", {"target": str(tmp_path / "list-target")}, store=RunStore(state)).run_id
    path = state / "runs" / bad / "events.jsonl"
    path.write_bytes(b"not json\n" + path.read_bytes())
    (state / "runs" / bad / "run.json").unlink()
    listed = cli("list", state_dir=state)
    assert listed.returncode == 0 and "broken" in listed.stdout and good in listed.stdout
    rows = {r["run_id"]: r["status"] for r in json.loads(cli("list", "--json", state_dir=state).stdout)["runs"]}
    assert rows[bad] == "broken" and rows[good] != "broken"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_stopped_cli_leaves_no_worker_and_the_trail_says_so(tmp_path: Path, signum: int) -> None:
    marker = tmp_path / "marker"
    state, run_id = toy_run(tmp_path, "sig", worker="slow", sleep="60", marker=str(marker))
    proc = cli_proc("advance", run_id, state_dir=state)
    worker, grandchild = worker_pids(marker)
    os.kill(proc.pid, signum)
    proc.wait(timeout=30)
    wait_for(lambda: not alive(worker) and not alive(grandchild), timeout=10)
    types = [e["type"] for e in events(state, run_id)]
    if signum == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL and types[-1] == "phase_started"
    else:
        stderr = proc.stderr.read().decode()
        assert proc.returncode == 128 + signum and stderr.splitlines()[-1].startswith("stopped by"), stderr
        assert "Traceback" not in stderr
        stopped = [e for e in events(state, run_id) if e["type"] == "command_interrupted"]
        assert stopped[0]["data"]["signal"] == signal.Signals(signum).name
    assert finishes_clean(state, run_id)
    assert "phase_interrupted" in [e["type"] for e in events(state, run_id)]


def test_concurrent_advances_act_once(tmp_path: Path) -> None:
    state, run_id = toy_run(tmp_path, "race")
    procs = [cli_proc("advance", run_id, state_dir=state) for _ in range(4)]
    codes = [p.wait(timeout=120) for p in procs]
    assert codes.count(0) >= 1 and all(c in (0, 2) for c in codes), codes
    assert all(b"busy" in p.stderr.read() for p, c in zip(procs, codes) if c == 2)
    assert set(passed_counts(state, run_id).values()) == {1}
    assert cli("audit", run_id, state_dir=state).returncode == 0


def test_a_git_lock_left_by_a_killed_command_is_cleared_before_the_phase_is_redone(tmp_path: Path) -> None:
    """Seen in the survey's kill -9 test: the rerun's git writes failed on the dead command's index.lock."""
    marker = tmp_path / "marker"
    state, run_id = toy_run(tmp_path, "lock", worker="slow", sleep="60", marker=str(marker))
    proc = cli_proc("advance", run_id, state_dir=state)
    worker_pids(marker)
    kill_group(proc)
    lock = tmp_path / "lock-target" / ".git" / "index.lock"
    lock.write_text("")  # git was writing the index when the command died
    assert finishes_clean(state, run_id)
    assert not lock.exists()
    (note,) = [e["data"]["text"] for e in events(state, run_id)
               if e["type"] == "note_added" and e["data"]["kind"] == "engine"]
    assert str(lock) in note
    repo = git.Repo(tmp_path / "lock-target")
    repo.index.add(["a.txt"])  # git writes work again


def test_a_git_lock_left_between_phases_is_cleared_at_the_next_advance(tmp_path: Path) -> None:
    """The survey's kill -9 flake (e2697a0): killed during a guard's `git status`, before any phase started, the
    command left index.lock with no phase in flight; the next advance's first git write (a revert) failed with 128."""
    state, run_id = toy_run(tmp_path, "between")
    lock = tmp_path / "between-target" / ".git" / "index.lock"
    lock.write_text("")
    assert finishes_clean(state, run_id)
    assert not lock.exists()
    notes = [e["data"]["text"] for e in events(state, run_id) if e["type"] == "note_added"]
    assert any(str(lock) in n and "no live process holds" in n for n in notes), notes


def test_a_git_lock_a_live_process_holds_is_left_alone(tmp_path: Path) -> None:
    state, run_id = toy_run(tmp_path, "held")
    lock = tmp_path / "held-target" / ".git" / "index.lock"
    with lock.open("w"):  # as git holds it while it writes the index
        assert finishes_clean(state, run_id)
        assert lock.exists()
    assert not any(str(lock) in e["data"].get("text", "") for e in events(state, run_id))
