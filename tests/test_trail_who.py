"""Who acted: every event a person or an agent makes records who it was (``who``), and show/audit display it.

Issue 39, tried as a new user would: an answer recorded `actor: "human"` and nothing about who (no user,
no host, no client), and seven of eight branch/commit answers came 0.27-0.55 s after the question, which
a script does; the trail could not tell. Now a person's acts carry the OS user and host, the name given
with `--as`, whether stdin was a terminal and the command and parent process that ran it; an agent's carry
the MCP client's name and version (from its initialize request) or our Anthropic loop's model. All of it is
self-reported by the process that wrote the event: the docs say so, and so do show and audit.
"""

from __future__ import annotations

import getpass
import json
import socket
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestrator.trail.store import RunStore
from tests.conftest import cli
from tests.reliability_kit import events
from tests.test_agent_driver import ScriptedModel
from tests.test_agent_tools import AGENT_TOY_REF, Caller, run_to_fix


@pytest.fixture
def agent_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHESTRATOR_WORKFLOWS", AGENT_TOY_REF)


@pytest.fixture
def answered_by_a_person(toy_repo: Path, state_dir: Path) -> str:
    """A person starts a toy run through the CLI, it asks the color, and a script answers it as "Ada"."""
    started = cli("start", "toy", "--target", str(toy_repo), "--json", state_dir=state_dir)
    run_id = json.loads(started.stdout)["run_id"]
    assert cli("advance", run_id, state_dir=state_dir).returncode == 3
    resumed = cli("resume", run_id, "--answer", "color=red", "--as", "Ada", "--no-advance", state_dir=state_dir)
    assert resumed.returncode == 0, resumed.stderr
    return run_id


def test_a_persons_acts_record_user_host_name_terminal_and_the_process(answered_by_a_person: str,
                                                                       state_dir: Path) -> None:
    trail = events(state_dir, answered_by_a_person)
    assert trail[0]["actor"] == "human" and trail[0]["who"]["kind"] == "person", trail[0]
    (answer,) = [e for e in trail if e["type"] == "answer_accepted"]
    who = answer["who"]
    assert who["kind"] == "person" and who["user"] == getpass.getuser() and who["host"] == socket.gethostname()
    assert who["as"] == "Ada" and who["tty"] is False, who
    assert who["command"].startswith("orchestrator resume ") and "--answer color=red" in who["command"], who
    assert who["parent"] == this_process(), who  # the process that ran the command: here the test, not a shell
    assert "who" not in next(e for e in trail if e["type"] == "phase_started")  # the engine's own events


def test_show_prints_text_with_who_acted_and_how_soon_after_the_question(answered_by_a_person: str,
                                                                         state_dir: Path) -> None:
    shown = cli("show", answered_by_a_person, state_dir=state_dir)
    assert shown.returncode == 0 and not shown.stdout.lstrip().startswith("{"), shown.stdout[:300]
    text = shown.stdout
    who = f"person {getpass.getuser()}@{socket.gethostname()} as Ada"
    assert who in text and "no tty" in text, text
    asked = next(e for e in events(state_dir, answered_by_a_person) if e["type"] == "question_asked")
    (line,) = [ln for ln in text.splitlines() if "color=red" in ln and ln.lstrip().startswith("seq ")]
    assert f"s after question seq {asked['seq']}" in line and who in line, line
    for section in ("phase", "status", "who acted", "recent events", "artifacts"):
        assert section in text, (section, text)
    body = json.loads(cli("show", answered_by_a_person, "--json", state_dir=state_dir).stdout)
    (act,) = [a for a in body["acts"] if a["type"] == "answer_accepted"]
    assert act["who"]["as"] == "Ada" and act["after_question"]["seq"] == asked["seq"], act


def test_audit_names_who_acted_and_says_it_is_self_reported(answered_by_a_person: str, state_dir: Path) -> None:
    text = cli("audit", answered_by_a_person, state_dir=state_dir).stdout
    assert f"person {getpass.getuser()}@{socket.gethostname()} as Ada" in text and "self-reported" in text, text
    body = json.loads(cli("audit", answered_by_a_person, "--json", state_dir=state_dir).stdout)
    assert {a["kind"] for a in body["actors"]} == {"person"}, body["actors"]


def test_an_mcp_clients_name_and_version_are_on_its_acts(agent_env: None, toy_repo: Path, state_dir: Path) -> None:
    """`orchestrator mcp` over stdio: the client's initialize request names it; the server's process is recorded
    (its parent is the client's process, here the test)."""
    import os
    import sys

    from mcp import Client, StdioServerParameters
    from mcp_types import Implementation

    from orchestrator import engine
    from tests.conftest import ROOT

    store = RunStore(state_dir)
    run_id = engine.start("agenttoy", {"target": str(toy_repo), "color": "red"}, store=store).run_id
    params = StdioServerParameters(command=sys.executable, cwd=str(ROOT), env=dict(os.environ),
                                   args=["-m", "orchestrator.cli", "mcp", "--state-dir", str(state_dir)])

    async def scenario() -> None:
        async with Client(params, read_timeout_seconds=120,
                          client_info=Implementation(name="audit-client", version="9.9.1")) as client:
            for _ in range(3):
                await client.call_tool("advance", {"run_id": run_id})
            await client.call_tool("write_file", {"run_id": run_id, "path": "allowed/fixed.txt", "content": "ok\n"})

    anyio.run(scenario)
    acts = [e for e in store.read_events(run_id) if e["actor"] == "agent"]
    assert acts and all(e["who"]["kind"] == "agent" and e["who"]["via"] == "mcp" and
                        e["who"]["client"] == {"name": "audit-client", "version": "9.9.1"} for e in acts), acts
    assert all(e["who"]["command"].startswith("orchestrator mcp") and e["who"]["parent"] == this_process()
               for e in acts), acts
    shown = cli("show", run_id, state_dir=state_dir).stdout
    assert "agent MCP client audit-client 9.9.1" in shown, shown
    changed = shown.split("\nfiles changed", 1)[1].split("\n\n", 1)[0]
    assert "agent MCP client audit-client 9.9.1  edit_recorded: allowed/fixed.txt" in changed, changed
    body = json.loads(cli("show", run_id, "--json", state_dir=state_dir).stdout)
    assert [c["files"] for c in body["changes"]] == [["allowed/fixed.txt"]], body["changes"]


def test_the_anthropic_loops_model_is_on_its_acts(agent_env: None, toy_repo: Path, state_dir: Path) -> None:
    from orchestrator.agent.driver import drive

    store = RunStore(state_dir)
    run_id = run_to_fix(Caller(store), toy_repo)
    model = ScriptedModel(run_id, [lambda r: [("note", {"run_id": r, "kind": "decision", "text": "looked"})],
                                   lambda r: "done"])
    drive(run_id, store=store, client=model.client(), model="claude-test-1")
    note = next(e for e in store.read_events(run_id) if e["type"] == "note_added" and e["actor"] == "agent")
    assert note["who"]["via"] == "anthropic" and note["who"]["model"] == "claude-test-1", note


def test_an_act_without_who_in_a_run_that_records_it_is_a_meaning_finding(answered_by_a_person: str,
                                                                         state_dir: Path) -> None:
    """What a hand-written line leaves (the key holder re-signs it): audit's meaning check names it."""
    from tests.test_reliability_tamper import reanchor, write_trail

    run_dir = state_dir / "runs" / answered_by_a_person
    trail: list[dict[str, Any]] = events(state_dir, answered_by_a_person)
    next(e for e in trail if e["type"] == "answer_accepted").pop("who")
    write_trail(run_dir, trail)
    reanchor(run_dir)
    body = json.loads(cli("audit", answered_by_a_person, "--json", state_dir=state_dir).stdout)
    assert [f["check"] for f in body["findings"]] == ["meaning"], body
    assert "records no one" in body["findings"][0]["message"], body


def this_process() -> str:
    """This test process's command line as the trail records a child's parent (under xdist a worker's, not pytest's)."""
    from orchestrator.trail.identity import _clip

    raw = Path("/proc/self/cmdline").read_bytes()
    return _clip(raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace"))
