"""The agent tool set without a transport: schemas, scope of the file tools, refusals, the hook.

``AGENT_TOY`` is the toy workflow whose fix phase declares ``allowed_paths=("allowed/",)``
and agent notes; the MCP and driver tests register it too (``AGENT_TOY_REF``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from orchestrator.agent import files
from orchestrator.agent.tools import TOOLS, call_tool
from orchestrator.trail.store import RunStore
from tests.conftest import ROOT, TOY, cli
from tests.toyflow import WORKFLOW as _TOY

AGENT_TOY = replace(_TOY, name="agenttoy", phases=tuple(
    replace(p, allowed_paths=("allowed/",), agent_notes="Create allowed/fixed.txt; touch nothing else.")
    if p.name == "fix" else p for p in _TOY.phases))
AGENT_TOY_REF = f"{TOY},agenttoy=tests.test_agent_tools:AGENT_TOY"


@pytest.fixture
def agent_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHESTRATOR_WORKFLOWS", AGENT_TOY_REF)


class Caller:
    """Calls tools the way a transport does, numbering the call ids."""

    def __init__(self, store: RunStore) -> None:
        self.store, self.count = store, 0

    def __call__(self, name: str, **arguments: Any) -> Any:
        self.count += 1
        return call_tool(name, arguments, store=self.store, call_id=f"call-{self.count}")


def run_to_fix(caller: Caller, target: Path) -> str:
    """A person starts the agent toy with the color given (human-only); the agent advances it to fix."""
    from orchestrator import engine

    run_id = engine.start("agenttoy", {"target": str(target), "color": "red"}, store=caller.store).run_id
    for _ in range(3):
        result = caller("advance", run_id=run_id)
    assert result.data["phase"] == "fix" and result.data["awaiting"] == "agent", result.message
    return run_id


def agent_events(store: RunStore, run_id: str) -> list[dict[str, Any]]:
    return [e for e in store.read_events(run_id) if e["type"] == "agent_acted"]


def test_every_tool_schema_is_draft_2020_12_without_anyof() -> None:
    assert {"start_run", "status", "advance", "list_runs", "read_artifact", "explain", "answer", "submit",
            "revert_patches", "note", "escalate", "read_file", "write_file", "edit_file",
            "apply_diff"} <= set(TOOLS)
    for spec in TOOLS.values():
        schema = spec.input_schema()
        jsonschema.Draft202012Validator.check_schema(schema)
        assert "anyOf" not in json.dumps(schema), spec.name
        assert schema["type"] == "object" and len(spec.description) > 30, spec.name
    from orchestrator.workflow import load_workflow

    for name in ("local-compile-perf", "add-moe-model"):  # the args_schema explain shows for each submission kind
        for kind, row in load_workflow(name).submissions.items():
            nested = row.args.model_json_schema(union_format="primitive_type_array")
            jsonschema.Draft202012Validator.check_schema(nested)
            assert "anyOf" not in json.dumps(nested), (name, kind)
    escalate = TOOLS["escalate"].input_schema()
    assert escalate["required"] == ["run_id", "question"]
    jsonschema.validate({"run_id": "r", "question": "q"}, escalate)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"run_id": "r", "question": "q", "extra": 1}, escalate)


def test_the_agents_guide_names_every_tool_and_the_readme_links_it() -> None:
    guide = (ROOT / "docs" / "agents.md").read_text()
    assert [name for name in TOOLS if f"`{name}`" not in guide] == []
    assert "## Your first day" in guide and "--waive CODE --reason TEXT" in guide
    assert "(docs/agents.md)" in (ROOT / "README.md").read_text()


def test_resolve_refuses_dotdot_absolute_outside_git_and_symlink_escape(tmp_path: Path) -> None:
    target = tmp_path / "t"
    (target / "allowed").mkdir(parents=True)
    (target / ".git").mkdir()
    (tmp_path / "secret.txt").write_text("s")
    (target / "allowed" / "out").symlink_to(tmp_path / "secret.txt")
    (target / "allowed" / "back").symlink_to(target / "a.txt")
    for bad in ("../secret.txt", "allowed/../../secret.txt", str(tmp_path / "secret.txt"), "allowed/out",
                ".git/config", ""):
        with pytest.raises(files.ScopeRefused):
            files.resolve_in_target(target, bad)
    assert files.resolve_in_target(target, str(target / "allowed" / "x.py"))[1] == "allowed/x.py"
    scope = files.Scope(target=target, phase="fix", allowed_paths=("allowed/",))
    with pytest.raises(files.ScopeRefused, match="outside the paths"):
        files.check_writable(scope, "allowed/back")  # inside allowed/ by name, resolves to a.txt
    with pytest.raises(files.ScopeRefused, match="outside the paths"):
        files.check_writable(scope, "allowedness.txt")
    with pytest.raises(files.ScopeRefused, match="allows no edits"):
        files.check_writable(replace(scope, allowed_paths=()), "allowed/x")
    assert files.check_writable(scope, "allowed/new/x.py")[1] == "allowed/new/x.py"


def test_apply_diff_checks_every_path_git_would_touch(toy_repo: Path) -> None:
    scope = files.Scope(target=toy_repo, phase="fix", allowed_paths=("allowed/",))
    inside = "--- a/allowed/README\n+++ b/allowed/README\n@@ -1 +1 @@\n-edit here\n+edited\n"
    outside = "--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-hello\n+bye\n"
    with pytest.raises(files.ScopeRefused, match="'a.txt' is outside"):
        files.apply_unified_diff(scope, inside + outside)
    assert (toy_repo / "allowed" / "README").read_text() == "edit here\n"  # nothing applied
    assert files.apply_unified_diff(scope, inside) == {"paths": ["allowed/README"]}
    assert (toy_repo / "allowed" / "README").read_text() == "edited\n"
    rename = "diff --git a/a.txt b/allowed/a.txt\nsimilarity index 100%\nrename from a.txt\nrename to allowed/a.txt\n"
    assert files.diff_paths(toy_repo, rename) == ["a.txt", "allowed/a.txt"]
    with pytest.raises(files.ScopeRefused, match="does not apply"):
        files.apply_unified_diff(scope, inside)  # already applied


def test_edit_keeps_line_endings_and_frozen_paths(toy_repo: Path) -> None:
    (toy_repo / "allowed" / "crlf.txt").write_bytes(b"one\r\ntwo\r\n")
    scope = files.Scope(target=toy_repo, phase="fix", allowed_paths=("allowed/",), frozen=("allowed/README",))
    assert files.replace_once(scope, "allowed/crlf.txt", "two", "2")["line"] == 2
    assert (toy_repo / "allowed" / "crlf.txt").read_bytes() == b"one\r\n2\r\n"
    with pytest.raises(files.ScopeRefused, match="frozen"):
        files.replace_once(scope, "allowed/README", "edit", "x")
    assert (toy_repo / "allowed" / "README").read_text() == "edit here\n"


def test_explain_shrinks_big_findings_into_json_objects() -> None:
    from orchestrator.agent.views import shrink

    findings = {"ranked": [{"op": f"op{i}", "gap_ms": i / 3} for i in range(5000)], "note": "x" * 30_000,
                "stop": {"stop": False}}
    small = shrink(findings)
    assert len(json.dumps(small)) <= 8000 and small["stop"] == {"stop": False}
    assert small["ranked"][0] == {"op": "op0", "gap_ms": 0.0} and small["ranked"][-1]["omitted"] > 4000
    assert small["note"].endswith("more chars)") and "json_head" not in json.dumps(small)
    assert shrink({"a": 1}) == {"a": 1}


def test_fix_cycle_and_refusals_are_recorded(agent_env: None, toy_repo: Path, state_dir: Path) -> None:
    store = RunStore(state_dir)
    call = Caller(store)
    run_id = run_to_fix(call, toy_repo)
    explained = call("explain", run_id=run_id)
    assert explained.data["allowed_paths"] == ["allowed/"]
    assert explained.data["issues"][0]["fix_location"] == "allowed/fixed.txt"
    assert "Create allowed/fixed.txt" in explained.data["agent_notes"]
    refused = call("write_file", run_id=run_id, path="a.txt", content="nope\n")
    assert refused.status == "refused" and (toy_repo / "a.txt").read_text() == "hello\n"
    assert call("write_file", run_id=run_id, path="allowed/fixed.txt", content="ok\n").status == "ok"
    done = call("advance", run_id=run_id)
    assert done.data["status"] == "done" and done.data["exit_code"] == 0
    acted = agent_events(store, run_id)
    assert [e["data"]["call_id"] for e in acted] == [f"call-{i}" for i in range(1, call.count + 1)]
    assert all(e["actor"] == "agent" for e in acted)
    writes = [e["data"] for e in acted if e["data"]["tool"] == "write_file"]
    assert writes[0]["outcome"].startswith("refused: ") and writes[0]["arguments"]["path"] == "a.txt"
    assert writes[1]["outcome"] == "ok"
    assert cli("audit", run_id, state_dir=state_dir).returncode == 0


def test_human_only_question_is_refused_and_escalation_waits(agent_env: None, toy_repo: Path,
                                                             state_dir: Path) -> None:
    store = RunStore(state_dir)
    call = Caller(store)
    run_id = call("start_run", workflow="agenttoy", options={"target": str(toy_repo)}).data["run_id"]
    assert call("advance", run_id=run_id).status == "waiting_for_human"
    refused = call("answer", run_id=run_id, key="color", value="red")
    assert refused.status == "refused" and refused.message.startswith("waiting for a human")
    state = store.read_state(run_id)
    assert state["awaiting"] == "human" and "color" not in state["answers"]
    assert call("note", run_id=run_id, kind="skill_feedback", text="the prompt was unclear").status == "ok"
    asked = call("escalate", run_id=run_id, question="Is blue acceptable here?", key="blue_ok", choices=["yes", "no"])
    assert asked.status == "waiting_for_human"
    pending = {q["key"]: q["human_only"] for q in store.read_state(run_id)["pending"]}
    assert pending == {"color": True, "blue_ok": True}
    events = store.read_events(run_id)
    assert [e["actor"] for e in events if e["type"] in ("note_added", "question_asked")][-2:] == ["agent", "agent"]
    patch = call("submit", run_id=run_id, kind="patch", args={"diff": "x", "label": "y"})
    assert "takes no temporary patches" in patch.message, patch  # the toy workflow has no patch phase
    outcomes = [e["data"]["outcome"] for e in agent_events(store, run_id)]
    assert outcomes[2].startswith("refused: waiting for a human") and outcomes[-1].startswith("refused: ")
    resumed = cli("resume", run_id, "--answer", "color=red", "--answer", "blue_ok=no", state_dir=state_dir)
    assert resumed.returncode == 4, resumed.stderr  # the human answered; the run now waits on the agent in fix


def test_check_path_hook_exit_codes(agent_env: None, toy_repo: Path, state_dir: Path) -> None:
    store = RunStore(state_dir)
    run_id = run_to_fix(Caller(store), toy_repo)
    base = [sys.executable, "-m", "orchestrator.cli", "check-path", run_id, "--state-dir", str(state_dir)]
    env = {**os.environ, "ORCHESTRATOR_WORKFLOWS": AGENT_TOY_REF}

    def hook(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
        return subprocess.run(base[:5] + list(args) + base[5:], input=stdin, capture_output=True, text=True,
                              cwd=ROOT, env=env, timeout=60)

    assert hook(str(toy_repo / "allowed" / "fix.py")).returncode == 0
    refused = hook("a.txt")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "outside the paths" in refused.stderr
    assert hook("../../etc/passwd").returncode == 2
    payload = json.dumps({"tool_name": "Edit", "tool_input": {"file_path": str(toy_repo / "a.txt")}})
    assert hook(stdin=payload).returncode == 2
    assert hook(stdin=json.dumps({"tool_name": "Bash", "tool_input": {"command": "ls"}})).returncode == 0


def test_cli_import_stays_free_of_torch_mcp_and_anthropic() -> None:
    code = ("import sys, orchestrator.cli; bad = sorted({m.split('.')[0] for m in sys.modules} & "
            "{'torch', 'mcp', 'anthropic', 'httpx2'}); print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_an_acting_call_the_os_or_a_bug_stops_is_still_in_the_trail(agent_env: None, toy_repo: Path, state_dir: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.agent import tools

    store = RunStore(state_dir)
    call = Caller(store)
    run_id = run_to_fix(call, toy_repo)
    under_a_file = call("write_file", run_id=run_id, path="allowed/README/x.txt", content="x\n")
    assert under_a_file.status == "refused" and under_a_file.is_error, under_a_file
    assert under_a_file.message.startswith("file NOT written: 'allowed/README/x.txt' could not be written: File exists")

    def broken(args: Any, env: Any) -> Any:
        raise RuntimeError("a bug in a handler")

    monkeypatch.setitem(tools.TOOLS, "note", replace(tools.TOOLS["note"], handler=broken))
    with pytest.raises(RuntimeError, match="a bug in a handler"):
        call("note", run_id=run_id, kind="devlog", text="x")
    acted = [e["data"] for e in agent_events(store, run_id)]
    assert [a["tool"] for a in acted[-2:]] == ["write_file", "note"], acted
    assert acted[-2]["outcome"].startswith("refused: file NOT written: ")
    assert acted[-1]["outcome"] == "error: the call stopped on an internal error (RuntimeError: a bug in a handler)"
    gone = call("advance", run_id="no-such-run")
    assert gone.status == "refused" and "not in the trail (there is no such run)" in gone.message, gone.message
    assert cli("audit", run_id, state_dir=state_dir).returncode == 0


def test_next_steps_in_a_phase_without_edits_point_to_its_submission_and_to_a_person_not_to_escalation():
    from types import SimpleNamespace

    from orchestrator.agent.views import next_steps

    state = {"status": "waiting", "awaiting": "agent", "violations": [], "run_id": "r1", "phase": "gap_analysis",
             "issues": [{"code": "residual_gap_unexplained", "fix_location": "temporary core patches"}],
             "attempts": {"gap_analysis": 1}}
    patch = SimpleNamespace(drive=False, args=SimpleNamespace(model_fields={"label": None}))
    steps = next_steps(state, SimpleNamespace(allowed_paths=()), submissions={"patch": patch})
    assert not [s for s in steps if "escalate" in s], steps
    assert any("submit kind=patch" in s for s in steps) and any("--waive CODE" in s for s in steps)
    assert steps[-1] == "call advance to re-run the phase"
    fresh = next_steps({**state, "issues": [], "attempts": {}}, SimpleNamespace(allowed_paths=()))
    assert fresh == ["call advance to run the phase"]


def test_next_steps_in_a_phase_that_waits_for_a_branch_name_its_submission_not_advance():
    """Blind trial of 2026-12-05: pick_fix's next_steps said "call advance to re-run the phase"; the call is submit."""
    from orchestrator.agent.views import next_steps
    from orchestrator.workflow import load_workflow

    workflow = load_workflow("local-compile-perf")
    spec = next(p for p in workflow.phases if p.name == "pick_fix")
    rows = {k: row for k, row in workflow.submissions.items() if row.phase == "pick_fix"}
    state = {"status": "waiting", "awaiting": "agent", "violations": [], "run_id": "r1", "phase": "pick_fix",
             "issues": [{"code": "candidate_wanted", "fix_location": "a new branch of T"}], "attempts": {"pick_fix": 1}}
    steps = next_steps(state, spec, submissions=rows)
    assert steps[-1].startswith("commit_branch your edits, then submit kind=candidate"), steps
    assert not [s for s in steps if "call advance" in s], steps
    assert next_steps({**state, "attempts": {}}, spec, submissions=rows)[-1] == "call advance to run the phase"


def test_why_names_the_findings_a_person_decides_when_no_question_is_pending() -> None:
    """A phase can wait for a person on a finding alone (e.g. a synthetic-config rule the model cannot meet):
    the trial's agent read "waiting for a human to answer: " with nothing after it."""
    from orchestrator.agent.views import why_waiting

    state = {"status": "waiting", "violations": [], "awaiting": "human", "pending": [], "phase": "synthetic_config",
             "issues": [{"code": "synthetic_rule_broken", "message": "m", "fix_location": "f"}], "summary": "s"}
    assert why_waiting(state) == ("waiting for a human: a decision on synthetic_rule_broken (waive with a reason, "
                                  "or abort)")
    asked = {**state, "pending": [{"key": "branch"}, {"key": "commit"}]}
    assert why_waiting(asked) == "waiting for a human: answer branch, commit"


def test_explain_while_another_process_advances_says_so_not_ready_to_run(agent_env: None, toy_repo: Path,
                                                                        state_dir: Path) -> None:
    """Tried as a new user would: during a long advance in one MCP call, explain in another said "phase ... is
    ready to run; call advance", and the agent's next advance was refused as busy."""
    from orchestrator import engine
    from tests.test_reliability_agent import HOLD_LOCK

    caller = Caller(RunStore(state_dir))
    run_id = engine.start("agenttoy", {"target": str(toy_repo), "color": "red"}, store=caller.store).run_id
    assert "ready to run" in caller("explain", run_id=run_id).message
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(caller.store.run_dir(run_id) / ".lock"), "30"],
                              stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        explained = caller("explain", run_id=run_id)
    finally:
        holder.kill()
        holder.wait()
    assert "ready to run" not in explained.message and "another process" in explained.data["why"], explained.message
    assert explained.data["next_steps"][0].startswith("wait"), explained.data["next_steps"]
    assert "ready to run" in caller("explain", run_id=run_id).message
