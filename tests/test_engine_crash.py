"""Crash safety: kill -9 of a worker and of the engine mid-phase, and the busy lock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from orchestrator import engine
from orchestrator.trail.audit import audit_run
from orchestrator.trail.store import RunStore
from tests.conftest import ROOT, cli


def start_toy(toy_repo: Path, state_dir: Path, **options: str) -> str:
    store = RunStore(state_dir)
    return engine.start("toy", {"target": str(toy_repo), "color": "red", **options}, store=store).run_id


def wait_for(predicate, *, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.1)


def event_types(state_dir: Path, run_id: str) -> list[str]:
    path = state_dir / "runs" / run_id / "events.jsonl"
    return [json.loads(line)["type"] for line in path.read_text().splitlines() if line.endswith("}")]


def test_worker_killed_with_sigkill_fails_the_phase_with_a_marker(toy_repo, state_dir):
    run_id = start_toy(toy_repo, state_dir, worker="die")
    outcome = engine.advance(run_id, store=RunStore(state_dir))
    assert outcome.exit_code == 1 and outcome.state["phase"] == "work"
    worker = [e for e in RunStore(state_dir).read_events(run_id) if e["type"] == "worker_finished"][0]["data"]
    assert worker["status"] == "failed" and worker["returncode"] == -signal.SIGKILL
    log = (state_dir / "runs" / run_id / "artifacts" / worker["log"]).read_text()
    assert "squaring" in log and log.rstrip().splitlines()[-1].startswith("FAILED")
    assert audit_run(state_dir / "runs" / run_id) == []


def test_engine_killed_mid_phase_is_detected_and_rerun(toy_repo, state_dir):
    marker = toy_repo.parent / "slept"
    run_id = start_toy(toy_repo, state_dir, worker="slow", sleep="60", marker=str(marker))
    engine_proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "advance", run_id, "--state-dir", str(state_dir)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    wait_for(lambda: event_types(state_dir, run_id)[-1:] == ["phase_started"]
             and "work" in (state_dir / "runs" / run_id / "run.json").read_text())
    busy = cli("advance", run_id, state_dir=state_dir)
    assert busy.returncode == 2 and "busy" in busy.stderr
    assert cli("status", run_id, "--json", state_dir=state_dir).returncode in (0, 1, 3, 4)
    os.killpg(engine_proc.pid, signal.SIGKILL)
    engine_proc.wait()
    before = event_types(state_dir, run_id)
    assert before[-1] == "phase_started"
    assert marker.exists()
    rerun = cli("advance", run_id, "--json", state_dir=state_dir)
    assert rerun.returncode == 4, rerun.stderr
    state = json.loads(rerun.stdout)
    store = RunStore(state_dir)
    after = event_types(state_dir, run_id)
    assert after[: len(before)] == before, "recorded events must never be rewritten"
    interrupted = [e for e in store.read_events(run_id) if e["type"] == "phase_interrupted"]
    assert interrupted and interrupted[0]["data"] == {"type": "phase_interrupted", "attempt": 1, "action": "rerun"}
    assert state["phase"] == "fix" and store.read_state(run_id)["attempts"]["work"] == 2
    assert audit_run(state_dir / "runs" / run_id) == []


def test_import_cli_does_not_import_torch():
    code = "import sys, orchestrator.cli; sys.exit(3 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_worker_timeout_is_killed_and_marked(toy_repo, tmp_path):
    from orchestrator.worker import run_worker

    request = {"n": 3, "mode": "slow", "sleep": 60, "marker": str(tmp_path / "marker")}
    result = run_worker("tests.toyflow.worker_fns:square", request, target=toy_repo, timeout_s=3)
    assert result.status == "timeout" and result.answer is None and result.seconds < 30
    last = result.log.decode().rstrip().splitlines()[-1]
    assert last.startswith("FAILED tests.toyflow.worker_fns:square status=timeout")
