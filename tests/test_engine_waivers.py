"""A person's waiver of a finding, on the toy workflow: recorded, applied, audited, refused when wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator import engine
from orchestrator.errors import BadAnswer
from orchestrator.trail.store import RunStore
from tests.conftest import cli


def _waiting_on_a_finding(store: RunStore, toy_repo: Path) -> str:
    run_id = engine.start("toy", {"target": str(toy_repo), "color": "red"}, store=store).run_id
    outcome = engine.advance(run_id, store=store)
    assert outcome.exit_code == 4 and outcome.state["issues"], outcome.state
    return run_id


def test_a_waived_finding_lets_the_phase_pass_and_audit_checks_it(tmp_path: Path, toy_repo: Path) -> None:
    store = RunStore(tmp_path / "state")
    run_id = _waiting_on_a_finding(store, toy_repo)
    code = store.read_state(run_id)["issues"][0]["code"]
    result = cli("resume", run_id, "--waive", code, "--reason", "accepted by the reviewer", "--json",
                 state_dir=tmp_path / "state")
    assert result.returncode == 0, result.stderr
    state = store.read_state(run_id)
    assert state["status"] == "done" and state["answers"][f"waive:fix:{code}"] == "accepted by the reviewer"
    assert state["results"]["fix"]["waived"] == {code: "accepted by the reviewer"}
    audit = cli("audit", run_id, state_dir=tmp_path / "state")
    assert audit.returncode == 0, audit.stdout + audit.stderr


def test_no_advance_records_the_waiver_and_leaves_the_run_to_the_next_advance(tmp_path: Path,
                                                                            toy_repo: Path) -> None:
    store = RunStore(tmp_path / "state")
    run_id = _waiting_on_a_finding(store, toy_repo)
    before = store.read_state(run_id)
    code = before["issues"][0]["code"]
    kept = cli("resume", run_id, "--waive", code, "--reason", "reviewed", "--no-advance", "--json",
               state_dir=tmp_path / "state")
    assert kept.returncode == 4, kept.stdout + kept.stderr
    state = store.read_state(run_id)
    assert (state["phase"], state["status"]) == (before["phase"], before["status"])
    assert state["answers"][f"waive:fix:{code}"] == "reviewed"
    said = json.loads(kept.stdout)["messages"]
    assert any(m.startswith("recorded only (--no-advance): nothing re-ran, so the summary above is still the fix "
                            "phase's from before") and f"orchestrator advance {run_id}" in m for m in said), said
    moved = cli("advance", run_id, "--json", state_dir=tmp_path / "state")
    assert moved.returncode == 0 and store.read_state(run_id)["status"] == "done", moved.stdout + moved.stderr


def test_waivers_are_refused_without_reason_for_agents_and_for_unknown_codes(tmp_path: Path, toy_repo: Path) -> None:
    store = RunStore(tmp_path / "state")
    run_id = _waiting_on_a_finding(store, toy_repo)
    code = store.read_state(run_id)["issues"][0]["code"]
    before = (tmp_path / "state" / "runs" / run_id / "events.jsonl").read_bytes()
    with pytest.raises(BadAnswer, match="only a person"):
        engine.resume(run_id, {}, store=store, actor="agent", waivers={code: "me"})
    with pytest.raises(BadAnswer, match="no finding 'nope'"):
        engine.resume(run_id, {}, store=store, waivers={"nope": "why"})
    with pytest.raises(BadAnswer, match="needs a reason"):
        engine.resume(run_id, {}, store=store, waivers={code: "  "})
    no_reason = cli("resume", run_id, "--waive", code, state_dir=tmp_path / "state")
    assert no_reason.returncode == 2 and "--reason" in no_reason.stderr
    assert (tmp_path / "state" / "runs" / run_id / "events.jsonl").read_bytes() == before


def test_audit_finds_a_waiver_forged_as_the_agent(tmp_path: Path, toy_repo: Path) -> None:
    from orchestrator.trail.audit_meaning import check_meaning
    from orchestrator.workflow import load_workflow

    store = RunStore(tmp_path / "state")
    run_id = _waiting_on_a_finding(store, toy_repo)
    state = store.read_state(run_id)
    code = state["issues"][0]["code"]
    engine.resume(run_id, {}, store=store, waivers={code: "fine"}, advance_after=False)
    trail = tmp_path / "state" / "runs" / run_id / "events.jsonl"
    events = [json.loads(line) for line in trail.read_text().splitlines()]
    assert not check_meaning(events, load_workflow("toy"))
    waiver = next(e for e in events if e["type"] == "answer_accepted" and e["data"]["key"].startswith("waive:"))
    waiver["actor"] = "agent"
    found = check_meaning(events, load_workflow("toy"))
    assert any("only a person may waive" in message for _, message in found), found


def _waiting_on_a_finding_and_a_question(store: RunStore, toy_repo: Path) -> str:
    """The toy run in fix with its finding open, and a question the agent escalated (issue 21)."""
    from orchestrator.agent.tools import call_tool

    run_id = _waiting_on_a_finding(store, toy_repo)
    asked = call_tool("escalate", {"run_id": run_id, "question": "May I skip the fix?", "key": "skip"},
                      store=store, call_id="call-1")
    assert asked.status == "waiting_for_human", asked.message
    return run_id


def test_a_waiver_beside_an_open_escalation_says_what_was_kept_and_what_still_waits(tmp_path: Path,
                                                                                  toy_repo: Path) -> None:
    state_dir = tmp_path / "state"
    store = RunStore(state_dir)
    run_id = _waiting_on_a_finding_and_a_question(store, toy_repo)
    text = cli("resume", run_id, "--waive", "missing_fix", "--reason", "accepted by the reviewer", state_dir=state_dir)
    assert text.returncode == 3, text.stderr
    said = text.stdout + text.stderr
    assert "recorded: waiver of missing_fix (phase fix), reason: accepted by the reviewer" in said, said
    assert "still waiting for a human: question 'skip'" in said and "May I skip the fix?" in said, said
    assert f"orchestrator resume {run_id} --answer skip=VALUE" in said, said
    assert "phase fix has not run again" in said, said
    assert store.read_state(run_id)["answers"]["waive:fix:missing_fix"] == "accepted by the reviewer"

    answered = cli("resume", run_id, "--answer", "skip=yes", "--json", state_dir=state_dir)
    payload = json.loads(answered.stdout)
    assert answered.returncode == 0, answered.stdout + answered.stderr  # the phase re-ran with the waiver: done
    assert payload["status"] == "done" and payload["still_waiting"] == [], payload
    assert payload["recorded"] == [{"kind": "answer", "key": "skip", "value": "yes", "for": "agent"}], payload
    assert cli("audit", run_id, state_dir=state_dir).returncode == 0


def test_a_waiver_beside_an_open_escalation_in_json(tmp_path: Path, toy_repo: Path) -> None:
    state_dir = tmp_path / "state"
    run_id = _waiting_on_a_finding_and_a_question(RunStore(state_dir), toy_repo)
    result = cli("resume", run_id, "--waive", "missing_fix", "--reason", "fine", "--json", state_dir=state_dir)
    assert result.returncode == 3, result.stderr
    payload = json.loads(result.stdout)
    assert payload["recorded"] == [{"kind": "waiver", "phase": "fix", "code": "missing_fix", "reason": "fine"}]
    (waiting,) = payload["still_waiting"]
    assert waiting == {"key": "skip", "prompt": "May I skip the fix?", "asked_by": "agent", "who": "human",
                       "answer_with": f"orchestrator resume {run_id} --answer skip=VALUE"}, waiting
    assert payload["moved"] is False and any("has not run again" in m for m in payload["messages"]), payload
