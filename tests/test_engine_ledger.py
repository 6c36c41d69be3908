"""The temporary-patch ledger: apply + measure + record, refusals, revert with proof, crashes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orchestrator import engine, ledger
from orchestrator.trail.audit import audit_run, audit_trail, check_open_patches
from orchestrator.errors import UsageError
from orchestrator.workflow import PATCH
from orchestrator.trail.store import RunStore
from tests.conftest import make_repo


@pytest.fixture(autouse=True)
def patchy(monkeypatch):
    monkeypatch.setenv("ORCHESTRATOR_WORKFLOWS", "toy=tests.toyflow:WORKFLOW,patchy=tests.toyflow.patchflow:WORKFLOW")


@pytest.fixture
def target(tmp_path: Path) -> Path:
    path = tmp_path / "target"
    make_repo(path, {"core/value.txt": "broken\n", "exp/code.py": "x = 1\n"})
    return path


def diff_for(target: Path, path: str, new: str) -> str:
    import difflib

    old = (target / path).read_text().splitlines(keepends=True)
    lines = difflib.unified_diff(old, new.splitlines(keepends=True), f"a/{path}", f"b/{path}")
    return "".join(lines)


def start(target: Path, state_dir: Path) -> tuple[RunStore, str]:
    store = RunStore(state_dir)
    run_id = engine.start("patchy", {"target": str(target)}, store=store).run_id
    assert engine.advance(run_id, store=store).exit_code == 4
    return store, run_id


def test_patch_is_measured_recorded_and_reverted_with_proof(target, state_dir):
    store, run_id = start(target, state_dir)
    outcome = engine.submit(run_id, PATCH, {"diff": diff_for(target, "core/value.txt", "fixed\n"), "label": "fix it"},
                            store=store, actor="agent", tool_call_id="call-1")
    rows = outcome.state["records"]["gap_row"]
    assert rows == [{"label": "fix it", "patch_id": rows[0]["patch_id"], "value": "fixed", "log": rows[0]["log"]}]
    assert (state_dir / "runs" / run_id / "artifacts" / rows[0]["log"]).is_file()
    assert len(outcome.state["open_patches"]) == 1
    waiting = audit_trail(state_dir / "runs" / run_id)
    assert waiting.findings == [], "a patch open while its phase waits is the phase's own state, not a broken trail"
    (note,) = [n for n in waiting.notes if "temporary patch" in n]
    assert f"{rows[0]['patch_id']} (fix it, seq " in note and "is applied while the run waits in phase" in note
    done = engine.advance(run_id, store=store)
    assert done.state["status"] == "done" and not done.state["open_patches"]
    assert (target / "core/value.txt").read_text() == "broken\n"
    reverted = [e for e in store.read_events(run_id) if e["type"] == "patch_reverted"][0]["data"]
    import git

    assert reverted["files"]["core/value.txt"] == git.Repo(target).git.rev_parse("HEAD:core/value.txt")
    assert audit_run(state_dir / "runs" / run_id) == []


@pytest.mark.parametrize("path, new, expected", [
    ("exp/code.py", "x = 2\n", "inside the permanent scope"),
])
def test_patch_inside_scope_is_refused_and_recorded(target, state_dir, path, new, expected):
    store, run_id = start(target, state_dir)
    with pytest.raises(UsageError, match=expected):
        engine.submit(run_id, PATCH, {"diff": diff_for(target, path, new), "label": "wrong"}, store=store)
    assert (target / path).read_text() == "x = 1\n", "workspace unchanged"
    state = store.read_state(run_id)
    assert state["records"]["patch_refused"][0]["label"] == "wrong" and not state["open_patches"]


def test_diff_that_does_not_apply_is_refused(target, state_dir):
    store, run_id = start(target, state_dir)
    bad = diff_for(target, "core/value.txt", "fixed\n").replace("-broken", "-something else")
    with pytest.raises(UsageError, match="does not apply"):
        engine.submit(run_id, PATCH, {"diff": bad, "label": "stale"}, store=store)
    assert (target / "core/value.txt").read_text() == "broken\n"


def test_second_run_on_the_same_workspace_cannot_patch_while_the_first_holds_it(target, state_dir):
    store, first = start(target, state_dir)
    engine.submit(first, PATCH, {"diff": diff_for(target, "core/value.txt", "half\n"), "label": "a"}, store=store)
    other_store, second = start(target, state_dir / "other")
    with pytest.raises(UsageError, match=f"holds temporary patches of run {first}"):
        engine.submit(second, PATCH, {"diff": diff_for(target, "core/value.txt", "fixed\n"), "label": "b"},
                      store=other_store)
    reverted = ledger.revert_patches(first, store=store)
    assert reverted.messages[0].startswith("reverted 1 temporary patch(es): ") and "(a)" in reverted.messages[0]
    engine.submit(second, PATCH, {"diff": diff_for(target, "core/value.txt", "fixed\n"), "label": "b"},
                  store=other_store)


def test_patch_outside_the_patch_phase_is_refused(toy_repo, state_dir, monkeypatch):
    store = RunStore(state_dir)
    run_id = engine.start("toy", {"target": str(toy_repo)}, store=store).run_id
    with pytest.raises(UsageError, match="takes no temporary patches"):
        engine.submit(run_id, PATCH, {"diff": "", "label": "x"}, store=store)


def test_killed_run_with_an_open_patch_reverts_it_on_the_next_advance(target, state_dir):
    store, run_id = start(target, state_dir)
    engine.submit(run_id, PATCH, {"diff": diff_for(target, "core/value.txt", "half\n"), "label": "half"}, store=store)
    with store.open_run(run_id) as run:  # what a kill -9 mid-phase leaves: phase_started, no completion
        from orchestrator.trail import events as ev

        run.append(ev.PhaseStarted(attempt=run.state["attempts"]["probe"] + 1), phase="probe")
    outcome = engine.advance(run_id, store=store)
    types = [e["type"] for e in store.read_events(run_id)]
    assert "phase_interrupted" in types and types.index("patch_reverted") > types.index("phase_interrupted")
    assert not outcome.state["open_patches"] and (target / "core/value.txt").read_text() == "broken\n"
    holder = Path(target / ".git" / ledger.LOCK_NAME)
    assert not holder.exists()
    assert json.dumps(outcome.state["records"]["gap_row"])  # the half row stays in the trail
    assert os.environ["ORCHESTRATOR_WORKFLOWS"].startswith("toy=")


def test_submit_command_takes_the_patch_row_and_refuses_what_the_table_lacks(target, state_dir):
    from tests.conftest import cli

    store, run_id = start(target, state_dir)
    seq = store.read_state(run_id)["last_seq"]
    unknown = cli("submit", run_id, "candidate", "--branch", "main", "--label", "x", state_dir=state_dir)
    assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1, unknown.stderr
    assert "takes no 'candidate' submissions (it takes: patch)" in unknown.stderr
    extra = cli("submit", run_id, "patch", "--diff", "x", "--label", "y", "--colour", "red", state_dir=state_dir)
    assert extra.returncode == 2 and "colour" in extra.stderr, extra.stderr
    assert store.read_state(run_id)["last_seq"] == seq, "refusals write nothing"
    done = cli("submit", run_id, "patch", "--diff=" + diff_for(target, "core/value.txt", "fixed\n"), "--label", "fix",
               "--json", state_dir=state_dir)
    assert done.returncode == 4, done.stderr
    assert [r["value"] for r in store.read_state(run_id)["records"]["gap_row"]] == ["fixed"]


def test_a_waived_residual_passes_the_patch_phase_with_every_patch_reverted(target, state_dir):
    """A person's waiver of the unexplained residual passes the phase; its temporary patches do not outlive it."""
    store, run_id = start(target, state_dir)
    engine.submit(run_id, PATCH, {"diff": diff_for(target, "core/value.txt", "half\n"), "label": "half"}, store=store)
    assert store.read_state(run_id)["open_patches"]
    outcome = engine.resume(run_id, {}, store=store, waivers={"unexplained": "the residual is accepted"})
    assert outcome.state["status"] == "done", outcome.state["summary"]
    assert not outcome.state["open_patches"] and (target / "core/value.txt").read_text() == "broken\n"
    completed = [e for e in store.read_events(run_id) if e["type"] == "phase_completed"][-1]["data"]["data"]
    assert completed["waived"] == {"unexplained": "the residual is accepted"} and completed["reverted"]
    assert audit_run(state_dir / "runs" / run_id) == []


@pytest.mark.parametrize("phase, status, finding", [
    ("gap_analysis", "waiting", False),
    ("gap_analysis", "running", False),
    ("doc", "waiting", True),
    ("done", "done", True),
    ("gap_analysis", "aborted", True),
])
def test_an_open_patch_is_a_finding_once_its_phase_is_left_or_the_run_ended(phase, status, finding):
    state = {"phase": phase, "status": status,
             "open_patches": {"patch-7-ab": {"label": "+fp32 gate", "files": {}, "seq": 7}}}
    events = [{"seq": 7, "type": "patch_applied", "phase": "gap_analysis", "data": {}}]
    found, notes = check_open_patches(state, events)
    assert [f.seq for f in found] == ([7] if finding else [])
    assert len(notes) == (0 if finding else 1)
