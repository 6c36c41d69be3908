"""Our Anthropic loop against a scripted model: the real SDK, the transport swapped for a script.

``ScriptedModel`` answers each ``messages.create`` with the next scripted turn (tool calls or a
final text), and keeps the requests so a test can check what the model was shown. A fix cycle
on another workflow only needs another script.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from orchestrator.agent.driver import AgentApiError, drive
from orchestrator.trail.store import RunStore
from tests.conftest import ROOT, cli
from tests.test_agent_tools import AGENT_TOY_REF, Caller, run_to_fix

SECRET = "sk-ant-test-never-in-the-trail"
Turn = Callable[[str], list[tuple[str, dict[str, Any]]] | str]
"""Given the run id: tool calls as (name, input) pairs, or the model's final text."""


class ScriptedModel:
    """An httpx2 handler playing the Messages API from a script."""

    def __init__(self, run_id: str, turns: list[Turn], *, status: int = 200) -> None:
        self.run_id, self.turns, self.status = run_id, list(turns), status
        self.requests: list[dict[str, Any]] = []

    def __call__(self, request: Any) -> Any:
        import httpx2

        body = json.loads(request.content)
        self.requests.append(body)
        if self.status != 200:
            return httpx2.Response(self.status, json={"type": "error", "error": {
                "type": "overloaded_error", "message": "Overloaded\nplease retry"}})
        step = self.turns.pop(0)(self.run_id)
        index = len(self.requests)
        if isinstance(step, str):
            content, stop = [{"type": "text", "text": step}], "end_turn"
        else:
            content = [{"type": "tool_use", "id": f"toolu_{index}_{n}", "name": name, "input": args}
                       for n, (name, args) in enumerate(step)]
            stop = "tool_use"
        return httpx2.Response(200, json={
            "id": f"msg_{index}", "type": "message", "role": "assistant", "model": body["model"],
            "content": content, "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": 100 * index, "output_tokens": 10}})

    def client(self) -> Any:
        import anthropic
        import httpx2

        return anthropic.Anthropic(api_key=SECRET, max_retries=0,
                                   http_client=httpx2.Client(transport=httpx2.MockTransport(self)))


@pytest.fixture
def agent_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHESTRATOR_WORKFLOWS", AGENT_TOY_REF)


def assert_secret_absent(state_dir: Path) -> None:
    for path in state_dir.rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path


def test_scripted_fix_cycle_finishes_the_run(agent_env: None, toy_repo: Path, state_dir: Path) -> None:
    store = RunStore(state_dir)
    run_id = run_to_fix(Caller(store), toy_repo)
    model = ScriptedModel(run_id, [
        lambda r: [("explain", {"run_id": r})],
        lambda r: [("write_file", {"run_id": r, "path": "allowed/fixed.txt", "content": "fixed\n"})],
        lambda r: [("advance", {"run_id": r})],
    ])
    result = drive(run_id, store=store, client=model.client(), model="claude-test", max_turns=10)
    assert (result.stop_reason, result.turns, result.tool_calls, result.exit_code) == ("done", 3, 3, 0)
    assert not model.turns and len(model.requests) == 3  # no call after the run finished
    first = model.requests[0]
    assert "allowed/" in first["system"] and "Create allowed/fixed.txt" in first["system"]
    assert "missing_fix" in first["system"] and {t["name"] for t in first["tools"]} >= {"explain", "advance"}
    explained = model.requests[1]["messages"][-1]["content"][0]
    assert explained["tool_use_id"] == "toolu_1_0" and json.loads(explained["content"])["data"]["allowed_paths"]
    acted = [e for e in store.read_events(run_id) if e["type"] == "agent_acted"]
    assert [e["data"]["call_id"] for e in acted][-3:] == ["toolu_1_0", "toolu_2_0", "toolu_3_0"]
    transcript = json.loads((store.run_dir(run_id) / "artifacts" / result.transcript).read_text())
    assert transcript["stop_reason"] == "done" and len(transcript["messages"]) == 7
    assert transcript["turns"][0]["usage"]["input_tokens"] == 100
    assert_secret_absent(state_dir)
    audit = cli("audit", run_id, state_dir=state_dir)
    assert audit.returncode == 0, audit.stdout


def test_scripted_escape_and_human_answer_are_refused(agent_env: None, toy_repo: Path, state_dir: Path) -> None:
    store = RunStore(state_dir)
    run_id = run_to_fix(Caller(store), toy_repo)
    outside = "--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-hello\n+bye\n"
    model = ScriptedModel(run_id, [
        lambda r: [("write_file", {"run_id": r, "path": "../escape.txt", "content": "x"}),
                   ("write_file", {"run_id": r, "path": "a.txt", "content": "x"}),
                   ("apply_diff", {"run_id": r, "diff": outside})],
        lambda r: [("escalate", {"run_id": r, "question": "Commit the fix?", "key": "commit_ok"}),
                   ("answer", {"run_id": r, "key": "commit_ok", "value": "yes"})],
    ])
    result = drive(run_id, store=store, client=model.client(), max_turns=10)
    assert (result.stop_reason, result.turns, result.tool_calls, result.exit_code) == ("human", 2, 5, 3)
    assert (toy_repo / "a.txt").read_text() == "hello\n" and not (toy_repo.parent / "escape.txt").exists()
    outcomes = [e["data"]["outcome"] for e in store.read_events(run_id) if e["type"] == "agent_acted"][-5:]
    assert [o.split(":")[0] for o in outcomes] == ["refused", "refused", "refused", "waiting for a human", "refused"]
    assert "waiting for a human" in outcomes[-1]
    results = model.requests[1]["messages"][-1]["content"]
    assert all(r["is_error"] for r in results)
    state = store.read_state(run_id)
    assert [q["key"] for q in state["pending"]] == ["commit_ok"] and "commit_ok" not in state["answers"]
    assert cli("audit", run_id, state_dir=state_dir).returncode == 0


def test_turn_limit_and_api_error(agent_env: None, toy_repo: Path, state_dir: Path) -> None:
    store = RunStore(state_dir)
    run_id = run_to_fix(Caller(store), toy_repo)
    model = ScriptedModel(run_id, [lambda r: [("status", {"run_id": r})]] * 2)
    result = drive(run_id, store=store, client=model.client(), max_turns=2)
    assert (result.stop_reason, result.turns, result.exit_code) == ("turn_limit", 2, 4)
    failing = ScriptedModel(run_id, [], status=529)
    with pytest.raises(AgentApiError, match="^Anthropic API error 529: ") as caught:
        drive(run_id, store=store, client=failing.client(), max_turns=2)
    assert "\n" not in caught.value.message
    transcripts = [n for n in store.read_state(run_id)["artifacts"] if n.startswith("agent/transcript-")]
    assert len(transcripts) == 2  # the failed drive still stored what it had
    assert_secret_absent(state_dir)


@pytest.mark.slow
def test_agent_command_exit_codes(agent_env: None, toy_repo: Path, state_dir: Path) -> None:
    store = RunStore(state_dir)
    run_id = run_to_fix(Caller(store), toy_repo)
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    command = [sys.executable, "-m", "orchestrator.cli", "agent", run_id, "--state-dir", str(state_dir)]
    missing = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "ANTHROPIC_API_KEY" in missing.stderr
    unreachable = {**env, "ANTHROPIC_API_KEY": SECRET, "ANTHROPIC_BASE_URL": "http://127.0.0.1:9"}
    failed = subprocess.run(command + ["--max-turns", "1"], capture_output=True, text=True, cwd=ROOT,
                            env=unreachable, timeout=120)
    assert failed.returncode == 1, failed.stderr
    assert failed.stderr.strip().splitlines()[-1].startswith("error: Anthropic API error")
    assert SECRET not in failed.stderr + failed.stdout
    assert_secret_absent(state_dir)


def test_an_edit_that_matches_twice_comes_back_as_an_error_that_says_nothing_changed(
        agent_env: None, toy_repo: Path, state_dir: Path) -> None:
    store = RunStore(state_dir)
    run_id = run_to_fix(Caller(store), toy_repo)
    (toy_repo / "allowed" / "twice.txt").write_text("ok\nok\n")
    model = ScriptedModel(run_id, [
        lambda r: [("edit_file", {"run_id": r, "path": "allowed/twice.txt", "old_string": "ok", "new_string": "x"})],
        lambda r: "stopping",
    ])
    drive(run_id, store=store, client=model.client(), max_turns=3)
    (result,) = model.requests[1]["messages"][-1]["content"]
    assert result["is_error"] is True, result
    answer = json.loads(result["content"])
    assert answer["status"] == "refused" and answer["message"].startswith("edit NOT made: old_string matches 2 times")
    assert (toy_repo / "allowed" / "twice.txt").read_text() == "ok\nok\n"
