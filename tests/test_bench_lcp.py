"""bench_lcp: the combined branch it submits, what it counts as tried, and cuts at the deadline."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import time
from pathlib import Path

import git
import pytest

from phases.local_compile_perf.workspace import materialize_embedded_workspace

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_lcp.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_lcp", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_run(state: Path, target: Path, verdicts: list[dict]) -> str:
    run_dir = state / "runs" / "lcp-run"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"target": str(target), "records": {"candidate_verdict": verdicts}}))
    return "lcp-run"


def test_combined_branch_replays_the_rewrites_in_order_and_leaves_main_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no git identity on the machine: the bench brings its own
    bench = load_bench()
    target = materialize_embedded_workspace(tmp_path / "state")
    run_id = fake_run(tmp_path / "state", target, [])
    names = ["norm-rope-cat", "narrow-scores", "gather-combine", "mlp-swiglu", "residual-norm"]
    bench.combine_branches(tmp_path / "state", run_id, names)
    repo = git.Repo(target)
    commits = list(repo.iter_commits("main..candidate/combined"))
    assert len(commits) == len(names)
    assert [c.message.splitlines()[0].split(":")[0] for c in reversed(commits)] == \
        ["attention", "experts", "moe", "moe", "block"]
    assert repo.active_branch.name == "main" and not repo.is_dirty(untracked_files=True)
    assert not any("combine" in w for w in repo.git.worktree("list").splitlines()[1:])
    assert bench.SHIPPED["combined"] == "rewrites " + " + ".join(names)


def test_tried_branches_reads_every_verdict(tmp_path):
    bench = load_bench()
    run_id = fake_run(tmp_path, tmp_path, [{"branch": "candidate/combined", "verdict": "rejected"},
                                           {"branch": "candidate/real-rope", "verdict": "validated"}])
    assert bench.tried_branches(tmp_path, run_id) == {"candidate/combined", "candidate/real-rope"}


def test_a_cut_at_the_deadline_kills_the_phase_workers_too(tmp_path, monkeypatch):
    """The CLI's children (phase workers holding the GPU) must not outlive a cut call."""
    bench = load_bench()
    pidfile = tmp_path / "worker.pid"
    fake_python = tmp_path / "python"
    fake_python.write_text(f"#!/bin/sh\nsleep 300 >/dev/null 2>&1 &\necho $! > {pidfile}\nwait\n")
    fake_python.chmod(0o755)
    monkeypatch.setattr(bench.sys, "executable", str(fake_python))
    with pytest.raises(subprocess.TimeoutExpired):
        bench.cli("advance", "lcp-run", state_dir=tmp_path, timeout=2)
    worker = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{worker}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{worker}").exists(), "the worker survived the cut"


def run_json(**fields) -> dict:
    return {"status": "waiting", "awaiting": "agent", "in_flight": None, "phase": "pick_fix", "pending": [],
            "summary": "", **fields}


def test_each_call_takes_the_run_from_where_it_stands():
    """A run cut mid-phase is advanced first; a branch already tried is not submitted again; answers follow."""
    bench = load_bench()
    act = bench.next_action
    todo, finish = ["combined"], True
    assert act(run_json(status="running", in_flight="correctness", phase="correctness", awaiting=None),
               todo=todo, tried=set(), finish=finish) == ("advance", "")
    assert act(run_json(status="running", awaiting=None, phase="plan"), todo=todo, tried=set(),
               finish=finish) == ("advance", "")
    assert act(run_json(), todo=todo, tried=set(), finish=finish) == ("candidate", "combined")
    assert act(run_json(), todo=todo, tried={"candidate/combined"}, finish=finish) == ("answer", "candidates=done")
    assert act(run_json(), todo=todo, tried={"candidate/combined"}, finish=False) is None
    asked = run_json(phase="findings", awaiting="human", pending=[{"key": "open_prs"}])
    assert act(asked, todo=todo, tried={"candidate/combined"}, finish=finish) == ("answer", "open_prs=no")
    assert act(run_json(status="done", awaiting=None, phase="done"), todo=todo, tried=set(), finish=finish) is None
    assert act(run_json(status="failed", awaiting=None), todo=todo, tried=set(), finish=finish) is None


def test_drive_stops_when_a_step_leaves_the_run_where_it_was(tmp_path, monkeypatch):
    bench = load_bench()
    run_dir = tmp_path / "runs" / "lcp-run"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps(run_json(status="running", awaiting=None, in_flight="baselines",
                                                          phase="baselines", last_seq=7, records={})))
    calls = []
    monkeypatch.setattr(bench, "cli", lambda *a, **kw: calls.append(a) or (1, {"phase": "baselines"}))
    args = bench.argparse.Namespace(deadline_s=60.0, resume="", continue_run=True, state_dir=tmp_path, combine="",
                                    combine_branch="combined", branches="", finish=True, candidate_s=60.0,
                                    phase_s=bench.PHASE_S)
    assert bench.drive(args) == "lcp-run" and calls == [("advance", "lcp-run")]


def test_a_phase_that_fails_again_when_rerun_stops_the_call(tmp_path, monkeypatch):
    """A phase that raises leaves the run in flight; rerunning it forever spun the CPU dry run of 2026-12-05."""
    bench = load_bench()
    run_dir = tmp_path / "runs" / "lcp-run"
    run_dir.mkdir(parents=True)
    seq = [7]

    def advance(*a, **kw):
        seq[0] += 3  # phase_interrupted, phase_started, artifact_written: the run moves, the phase fails
        (run_dir / "run.json").write_text(json.dumps(run_json(status="running", awaiting=None, in_flight="findings",
                                                              phase="findings", last_seq=seq[0], records={})))
        return 1, {}

    advance()
    monkeypatch.setattr(bench, "cli", advance)
    args = bench.argparse.Namespace(deadline_s=60.0, resume="", continue_run=True, state_dir=tmp_path, combine="",
                                    combine_branch="combined", branches="", finish=True, candidate_s=60.0,
                                    phase_s=bench.PHASE_S)
    bench.drive(args)
    assert seq[0] == 7 + 3 * 3, "the first advance, and one retry of the failed phase"


def test_a_call_stops_before_a_phase_it_cannot_finish_and_runs_one_longer_than_any_call(tmp_path, monkeypatch):
    bench = load_bench()
    run_dir = tmp_path / "runs" / "lcp-run"
    run_dir.mkdir(parents=True)

    def state(phase, attempts):
        (run_dir / "run.json").write_text(json.dumps({"in_flight": phase, "attempts": attempts}))

    state("screen_confirm", {"graph_budget": 1, "screen_confirm": 1})
    now = time.monotonic()
    stop = bench.phase_stop(tmp_path, "lcp-run", deadline=now + 100, call_s=550, call_started=now - 400,
                            phase_s={"screen_confirm": 290, "correctness": 250, "findings": 1800})
    assert stop() == "", "the phase in flight when the call began runs on"
    state("correctness", {"graph_budget": 1, "screen_confirm": 1, "correctness": 1})
    assert stop() == "stopping before correctness: it takes about 250 s, 100 s are left in this call"
    clock = [1000.0]
    monkeypatch.setattr(bench.time, "monotonic", lambda: clock[0])
    state("screen_confirm", {"screen_confirm": 2})
    early = bench.phase_stop(tmp_path, "lcp-run", deadline=1300.0, call_s=550, call_started=995.0,
                             phase_s={"screen_confirm": 290})
    state("screen_confirm", {"screen_confirm": 3})
    assert early() == "", "the call's first work: the rerun of the phase it found cut"
    clock[0] = 1100.0
    assert early() == "", "a phase allowed to run is not stopped midway (the CPU dry run of 2026-12-05 was)"
    state("findings", {"correctness": 1, "findings": 1})
    assert stop() == "", "findings outlasts any call: it runs until the deadline and continues in the next"
    fresh = bench.phase_stop(tmp_path, "lcp-run", deadline=time.monotonic() + 100, call_s=550,
                             call_started=time.monotonic(), phase_s={"feedback": 500})
    state("feedback", {"feedback": 1})
    assert fresh() == "", "a call's first work always starts"


def test_a_refused_start_prints_the_refusal_and_exits_with_its_code(tmp_path):
    """bench/h200_lcp.sh start with two token counts died in 1 s on a KeyError (the H100 try of issue 38)."""
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OUT": str(out), "STATE_DIR": str(tmp_path / "state"), "WHEELS": str(tmp_path / "none"),
           "TOKENS": "4096,16384"}
    done = subprocess.run(["bash", str(BENCH.parent / "h200_lcp.sh"), "start"], cwd=BENCH.parents[1], env=env,
                          capture_output=True, text=True, timeout=300)
    log = (out / "log_start.txt").read_text()
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "start refused (exit 2): local-compile-perf: --tokens: Value error, needs at least 3 distinct positive " \
           "token counts (skill step 1), got [4096, 16384]" in log
    assert "Traceback" not in log + done.stdout + done.stderr


PACK = BENCH.parent / "pack_state.sh"


def test_a_device_state_is_packed_without_reference_captures_in_parts_that_come_back(tmp_path):
    """A call cut in correctness leaves the fp64 reference capture (tens of GB at real dims) in scratch:
    packed with it, the state outran the call and could not come back (the H200 call of 2026-12-04 17:21)."""
    state = tmp_path / ".devstate" / "state"
    worktrees = state / "scratch" / "run-1" / "worktrees"
    worktrees.mkdir(parents=True)
    with open(worktrees / "1-stack-reference.pt", "wb") as f:
        f.truncate(64 << 30)  # sparse: reading it would take minutes
    (state / "runs").mkdir()
    (state / "runs" / "events.jsonl").write_bytes(os.urandom(20 << 20))
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(["bash", str(PACK), ".devstate/state", str(out / "state_combine.tgz")], cwd=tmp_path,
                   check=True, timeout=60)
    parts = sorted(out.iterdir())
    assert len(parts) == 2 and all(p.stat().st_size <= 15 << 20 for p in parts), parts
    unpacked = tmp_path / "here"
    unpacked.mkdir()
    subprocess.run(f"cat {out}/state_combine.tgz.part-* | tar xzf -", shell=True, cwd=unpacked, check=True)
    back = unpacked / ".devstate" / "state"
    assert (back / "runs" / "events.jsonl").read_bytes() == (state / "runs" / "events.jsonl").read_bytes()
    assert (back / "scratch" / "run-1" / "worktrees").is_dir()
    assert not (back / "scratch" / "run-1" / "worktrees" / "1-stack-reference.pt").exists()


def test_the_report_prints_every_cited_median_so_a_lost_state_still_leaves_the_numbers(tmp_path, capsys):
    import tarfile
    with tarfile.open(BENCH.parent / "results" / "2026-12-04-h200-lcp" / "evidence.tgz") as tar:
        tar.extractall(tmp_path, filter="data")
    run_id = next((tmp_path / "runs").iterdir()).name
    load_bench().report(tmp_path, run_id)
    lines = capsys.readouterr().out.splitlines()
    cited = [line for line in lines if line.startswith("cited ")]
    assert "cited baseline eager at 2048: wall 36.72 ms, glue 11.72 ms" in cited
    assert any(line.startswith("cited confirm c1-b912 candidate at 16384: wall ") for line in cited), cited
