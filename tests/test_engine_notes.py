"""Every note the engine writes states only what an event of the trail shows.

Issue 39, tried as a new user would: after an internal error, a note said gap analysis "reverted its open
patches" where no patch had been applied and no revert event existed. Each such statement is now made
from the events: a revert is claimed only with the seq of its ``patch_reverted``, a worker's kill only with
its ``worker_finished``, and the CLI says the trail recorded a stop only when it wrote the event.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator import engine
from orchestrator.context import phase_context
from orchestrator.phase_api import PhaseResult
from orchestrator.trail.store import RunStore
from tests.conftest import ROOT
from tests.toyflow import WORKFLOW as TOY

A_PATCH = "--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-hello\n+patched\n"


def reconcile_gap_analysis(store: RunStore, run_id: str, monkeypatch: pytest.MonkeyPatch, *,
                           patch: bool) -> list[dict]:
    """gap_analysis.reconcile on a real run and target (the phase's measuring part stubbed): the events it adds."""
    from orchestrator import ledger
    from phases.add_moe_model import gap_analysis

    monkeypatch.setattr(gap_analysis, "run", lambda ctx: PhaseResult(outcome="passed", summary="rerun"))
    with store.open_run(run_id) as run:
        ctx = phase_context(run, TOY, phase="work")
        if patch:
            ledger.apply_in_context(ctx, diff=A_PATCH, label="probe", scope=("allowed/",))
        before = run.state["last_seq"]
        gap_analysis.reconcile(ctx)
        return [e for e in run.read_events() if e["seq"] > before]


def test_a_reconcile_with_nothing_open_does_not_say_it_reverted(toy_repo: Path, state_dir: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    store = RunStore(state_dir)
    run_id = engine.start("toy", {"target": str(toy_repo), "color": "red"}, store=store).run_id
    added = reconcile_gap_analysis(store, run_id, monkeypatch, patch=False)
    assert [e["type"] for e in added] == ["note_added"], added
    text = added[0]["data"]["text"]
    assert "reverted" not in text and "no temporary patch was open" in text, text


def test_a_reconcile_that_reverts_names_the_revert_event(toy_repo: Path, state_dir: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    store = RunStore(state_dir)
    run_id = engine.start("toy", {"target": str(toy_repo), "color": "red"}, store=store).run_id
    added = reconcile_gap_analysis(store, run_id, monkeypatch, patch=True)
    reverted, note = [e for e in added if e["type"] == "patch_reverted"], added[-1]
    assert len(reverted) == 1 and note["type"] == "note_added", added
    assert f"patch_reverted seq {reverted[0]['seq']}" in note["data"]["text"], note
    assert (toy_repo / "a.txt").read_text() == "hello\n"


def children_of(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


def test_a_stop_before_any_event_does_not_say_the_trail_records_it(tmp_path: Path) -> None:
    """SIGTERM while `start` still checks the model in a worker: no run exists yet, so nothing is recorded."""
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "start", "add-moe-model", "--model",
                             "Qwen/Qwen3-30B-A3B", "--state-dir", str(tmp_path / "state")],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not children_of(proc.pid) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert children_of(proc.pid), "start never ran its check worker"
    os.kill(proc.pid, signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143 and stderr.splitlines()[-1].startswith("stopped by SIGTERM"), stderr
    assert "the trail records" not in stderr and "nothing was recorded" in stderr, stderr
    assert not list((tmp_path / "state" / "runs").glob("add-moe-model-*"))


def test_a_stop_mid_phase_names_the_event_that_records_it(tmp_path: Path) -> None:
    from tests.reliability_kit import cli_proc, events, worker_pids
    from tests.test_reliability_crash import toy_run

    marker = tmp_path / "marker"
    state, run_id = toy_run(tmp_path, "sig", worker="slow", sleep="60", marker=str(marker))
    proc = cli_proc("advance", run_id, state_dir=state)
    worker_pids(marker)
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)
    stderr = proc.stderr.read().decode()
    (stopped,) = [e for e in events(state, run_id) if e["type"] == "command_interrupted"]
    assert f"command_interrupted seq {stopped['seq']}" in stderr.splitlines()[-1], stderr
    assert json.loads(json.dumps(stopped))["data"]["signal"] == "SIGTERM"
