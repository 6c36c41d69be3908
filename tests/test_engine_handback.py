"""``orchestrator resume RUN --results DIR``: a phase's work run elsewhere, handed back through its hook."""

from __future__ import annotations

import json
from pathlib import Path

from tests.test_engine_cli import events_count, run_id_of


def waiting_run(invoke, toy_repo: Path, state_dir: Path) -> str:
    run_id = run_id_of(invoke("start", "toy", "--target", str(toy_repo), "--state-dir", str(state_dir), "--json"))
    assert invoke("advance", run_id, "--state-dir", str(state_dir)).exit_code == 3
    return run_id


def test_results_become_the_humans_artifacts_records_and_answers(toy_repo, state_dir, invoke, tmp_path):
    run_id = waiting_run(invoke, toy_repo, state_dir)
    results = tmp_path / "job"
    results.mkdir()
    (results / "color.txt").write_text("red\n")
    resumed = invoke("resume", run_id, "--results", str(results), "--state-dir", str(state_dir), "--json")
    assert resumed.exit_code == 4, resumed.output
    events = [json.loads(line) for line in (state_dir / "runs" / run_id / "events.jsonl").read_text().splitlines()]
    handed = [e for e in events if e["actor"] == "human" and e["phase"] == "ask"]
    assert [e["type"] for e in handed] == ["artifact_written", "record_added", "note_added", "answer_accepted"]
    assert handed[1]["data"]["record"] == {"color": "red"} and handed[3]["data"]["value"] == "red"
    assert (state_dir / "runs" / run_id / "artifacts" / "handed" / "color.txt").read_text() == "red\n"
    assert invoke("audit", run_id, "--state-dir", str(state_dir)).exit_code == 0


def test_unusable_results_exit_2_and_write_nothing(toy_repo, state_dir, invoke, tmp_path):
    run_id = waiting_run(invoke, toy_repo, state_dir)
    before = events_count(state_dir, run_id)
    empty = tmp_path / "empty"
    empty.mkdir()
    for directory in (tmp_path / "missing", empty):
        result = invoke("resume", run_id, "--results", str(directory), "--state-dir", str(state_dir), "--json")
        assert result.exit_code == 2, result.output
        assert "error" in json.loads(result.output)
    assert events_count(state_dir, run_id) == before


def test_a_phase_without_a_results_hook_refuses_them(toy_repo, state_dir, invoke, tmp_path):
    run_id = waiting_run(invoke, toy_repo, state_dir)
    assert invoke("resume", run_id, "--answer", "color=red", "--state-dir", str(state_dir)).exit_code == 4
    before = events_count(state_dir, run_id)
    result = invoke("resume", run_id, "--results", str(tmp_path), "--state-dir", str(state_dir), "--json")
    assert result.exit_code == 2 and "takes no handed-back results" in json.loads(result.output)["error"]["message"]
    assert events_count(state_dir, run_id) == before
