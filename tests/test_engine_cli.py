"""The CLI contract: exit codes, --json shapes, and bad input that writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import cli


def run_id_of(result) -> str:
    return json.loads(result.stdout)["run_id"]


def events_count(state_dir: Path, run_id: str) -> int:
    return len((state_dir / "runs" / run_id / "events.jsonl").read_text().splitlines())


def test_exit_codes_through_a_whole_run(toy_repo, state_dir, invoke):
    started = invoke("start", "toy", "--target", str(toy_repo), "--state-dir", str(state_dir), "--json")
    assert started.exit_code == 0, started.output
    run_id = run_id_of(started)
    waiting_human = invoke("advance", run_id, "--state-dir", str(state_dir), "--json")
    assert waiting_human.exit_code == 3, waiting_human.output
    status = json.loads(waiting_human.output)
    assert status["awaiting"] == "human" and status["pending"][0]["key"] == "color"
    for key in ("run_id", "workflow", "target", "phase", "status", "awaiting", "pending", "issues",
                "last_seq", "chain_head"):
        assert key in status
    waiting_agent = invoke("resume", run_id, "--answer", "color=red", "--state-dir", str(state_dir), "--json")
    assert waiting_agent.exit_code == 4, waiting_agent.output
    assert json.loads(waiting_agent.output)["issues"][0]["code"] == "missing_fix"
    (toy_repo / "allowed" / "fixed.txt").write_text("ok\n")
    done = invoke("advance", run_id, "--state-dir", str(state_dir))
    assert done.exit_code == 0, done.output
    assert invoke("audit", run_id, "--state-dir", str(state_dir)).exit_code == 0


def test_guard_violation_exits_1_and_is_recorded(toy_repo, state_dir, invoke):
    run_id = run_id_of(invoke("start", "toy", "--target", str(toy_repo), "--color", "red",
                              "--state-dir", str(state_dir), "--json"))
    (toy_repo / "a.txt").write_text("edited outside scope\n")
    result = invoke("advance", run_id, "--state-dir", str(state_dir), "--json")
    assert result.exit_code == 1, result.output
    violations = json.loads(result.output)["violations"]
    assert violations[0]["guard"] == "scope" and violations[0]["paths"] == ["a.txt"]
    (toy_repo / "a.txt").write_text("hello\n")
    (toy_repo / "allowed" / "fixed.txt").write_text("ok\n")
    assert invoke("advance", run_id, "--state-dir", str(state_dir)).exit_code == 0


def test_bad_answers_exit_2_and_write_nothing(toy_repo, state_dir, invoke):
    run_id = run_id_of(invoke("start", "toy", "--target", str(toy_repo), "--state-dir", str(state_dir), "--json"))
    invoke("advance", run_id, "--state-dir", str(state_dir))
    before = events_count(state_dir, run_id)
    for answer in ("color=green", "shape=round", "color"):
        result = invoke("resume", run_id, "--answer", answer, "--state-dir", str(state_dir), "--json")
        assert result.exit_code == 2, (answer, result.output)
        assert "error" in json.loads(result.output)
    assert events_count(state_dir, run_id) == before


def test_unknown_workflow_and_run_and_bad_options(toy_repo, state_dir, invoke):
    assert invoke("start", "nope", "--state-dir", str(state_dir)).exit_code == 2
    assert invoke("status", "missing-run", "--state-dir", str(state_dir)).exit_code == 2
    assert invoke("start", "toy", "--target", str(toy_repo), "--bogus", "1",
                  "--state-dir", str(state_dir)).exit_code == 2
    assert invoke("start", "toy", "--target", str(toy_repo.parent), "--state-dir", str(state_dir)).exit_code == 2
    assert not (state_dir / "runs").exists() or not list((state_dir / "runs").iterdir())


def test_unwritable_state_dir_exits_2(toy_repo, tmp_path, invoke):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = invoke("start", "toy", "--target", str(toy_repo), "--state-dir", str(blocker / "state"), "--json")
    assert result.exit_code == 2
    assert "not writable" in json.loads(result.output)["error"]["message"]


def test_missing_or_truncated_trail_exits_2(toy_repo, state_dir, invoke):
    run_id = run_id_of(invoke("start", "toy", "--target", str(toy_repo), "--state-dir", str(state_dir), "--json"))
    log = state_dir / "runs" / run_id / "events.jsonl"
    log.write_bytes(log.read_bytes()[:-10])
    result = invoke("advance", run_id, "--state-dir", str(state_dir))
    assert result.exit_code == 2 and "truncated" in result.output
    log.unlink()
    result = invoke("resume", run_id, "--answer", "color=red", "--state-dir", str(state_dir))
    assert result.exit_code == 2 and "missing" in result.output


def test_finished_and_aborted_runs_refuse_to_resume(toy_repo, state_dir, invoke):
    run_id = run_id_of(invoke("start", "toy", "--target", str(toy_repo), "--state-dir", str(state_dir), "--json"))
    assert invoke("abort", run_id, "--reason", "wrong model", "--state-dir", str(state_dir)).exit_code == 0
    result = invoke("resume", run_id, "--answer", "color=red", "--state-dir", str(state_dir))
    assert result.exit_code == 2 and "aborted" in result.output
    assert invoke("advance", run_id, "--state-dir", str(state_dir)).exit_code == 2


def test_abort_says_which_edits_it_leaves_in_the_target(toy_repo, state_dir, invoke):
    """Blind trial 2 (doge): the abort said nothing of the agent's uncommitted edit still in the workspace."""
    (toy_repo / "before.txt").write_text("there at start\n")
    run_id = run_id_of(invoke("start", "toy", "--target", str(toy_repo), "--state-dir", str(state_dir), "--json"))
    (toy_repo / "edited.txt").write_text("the agent's edit\n")
    result = invoke("abort", run_id, "--reason", "stop here", "--state-dir", str(state_dir))
    assert result.exit_code == 0 and "1 uncommitted change(s) made during the run" in result.output
    assert "edited.txt" in result.output and "before.txt" not in result.output
    trail = (state_dir / "runs" / run_id / "events.jsonl").read_text()
    assert "the abort reverts nothing" in trail  # a note for the auditor too


def test_graph_lists_every_phase_and_edge(invoke):
    result = invoke("graph", "toy")
    assert result.exit_code == 0
    assert "ask -->|next| work" in result.output and "fix -->|next| done" in result.output


def test_real_subprocess_cli_prints_one_error_line(state_dir):
    result = cli("status", "no-such-run", state_dir=state_dir)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr


def test_state_dir_and_json_go_before_or_after_the_command(toy_repo, state_dir, invoke):
    started = invoke("--state-dir", str(state_dir), "--json", "start", "toy", "--target", str(toy_repo))
    assert started.exit_code == 0, started.output
    run_id = run_id_of(started)
    before = invoke("--state-dir", str(state_dir), "--json", "status", run_id)
    after = invoke("status", run_id, "--state-dir", str(state_dir), "--json")
    mixed = invoke("--json", "status", run_id, "--state-dir", str(state_dir))
    assert [r.exit_code for r in (before, after, mixed)] == [0, 0, 0], before.output + after.output
    assert json.loads(before.output) == json.loads(after.output) == json.loads(mixed.output)
    listed = invoke(f"--state-dir={state_dir}", "list")
    assert listed.exit_code == 0 and run_id in listed.output, listed.output
    same = invoke("--state-dir", str(state_dir), "status", run_id, "--state-dir", str(state_dir))
    assert same.exit_code == 0, same.output


def test_bad_global_options_are_one_line_and_exit_2(state_dir):
    for args in (["--state-dir"], ["--state-dir", str(state_dir), "status", "x", "--state-dir", "/elsewhere"],
                 ["--state-dir", str(state_dir)], ["--bogus", "status"]):
        text, as_json = cli(*args), cli("--json", *args)
        assert text.returncode == 2 and text.stderr.count("\n") == 1 and not text.stdout, (args, text.stderr)
        assert as_json.returncode == 2 and "error" in json.loads(as_json.stdout), (args, as_json.stdout)
    assert "given twice" in cli("--state-dir", "a", "list", "--state-dir", "b").stderr
    assert not state_dir.exists()
