"""The MCP server through a real MCP client: in process, and as `orchestrator mcp` over stdio."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestrator import engine
from orchestrator.agent.tools import TOOLS
from orchestrator.trail.store import RunStore
from tests.conftest import ROOT, cli
from tests.test_agent_tools import AGENT_TOY_REF


@pytest.fixture
def agent_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHESTRATOR_WORKFLOWS", AGENT_TOY_REF)


def answer_of(result: Any) -> dict[str, Any]:
    payload = json.loads(result.content[0].text)
    assert result.is_error == (payload["status"] in ("refused", "error")), payload
    return payload


async def call(client: Any, tool: str, /, **arguments: Any) -> dict[str, Any]:
    return answer_of(await client.call_tool(tool, arguments))


def test_in_process_client_drives_the_toy_run(agent_env: None, toy_repo: Path, state_dir: Path) -> None:
    from mcp import Client

    from orchestrator.agent.mcp_server import build_server

    store = RunStore(state_dir)
    (toy_repo / "allowed" / "link").symlink_to(toy_repo.parent)
    progress: list[tuple[float, float | None, str]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total, message or ""))

    async def scenario() -> str:
        async with Client(build_server(store)) as client:
            listed = (await client.list_tools()).tools
            assert {t.name: t.input_schema for t in listed} == {n: s.input_schema() for n, s in TOOLS.items()}
            run_id = (await call(client, "start_run", workflow="agenttoy", options={"target": str(toy_repo)})
                      )["data"]["run_id"]
            assert (await call(client, "advance", run_id=run_id))["status"] == "waiting_for_human"
            refused = await call(client, "answer", run_id=run_id, key="color", value="red")
            assert refused["status"] == "refused" and "waiting for a human" in refused["message"]
            assert store.read_state(run_id)["awaiting"] == "human"
            engine.resume(run_id, {"color": "red"}, store=store, advance_after=False)  # the human answers
            for _ in range(3):  # ask (answered now), work, fix
                moved = answer_of(await client.call_tool("advance", {"run_id": run_id}, progress_callback=on_progress))
            assert moved["data"]["phase"] == "fix" and moved["data"]["awaiting"] == "agent"
            artifact = await client.call_tool("read_artifact", {"run_id": run_id, "name": "square.json"})
            assert json.loads(artifact.content[1].text) == {"square": 49}
            for tool, path in (("read_file", "../state"), ("read_file", "/etc/passwd"),
                               ("read_file", "allowed/link/state"), ("write_file", "allowed/link/x.txt"),
                               ("write_file", "a.txt"), ("write_file", "allowed/../a.txt")):
                extra = {"content": "x\n"} if tool == "write_file" else {}
                assert (await call(client, tool, run_id=run_id, path=path, **extra))["status"] == "refused", path
            assert (await call(client, "write_file", run_id=run_id, path="allowed/fixed.txt", content="ok\n")
                    )["status"] == "ok"
            assert (await call(client, "advance", run_id=run_id))["data"]["status"] == "done"
            return run_id

    run_id = anyio.run(scenario)
    assert [m for _, _, m in progress] == ["work: worker square started | phase step 1 of 1, ETA after the first step",
                                           "work: squaring | phase step 1 of 1, ETA after the first step"], progress
    # every notification carries the phase's planned steps as its total; progress rises with each one
    assert [t for _, t, _ in progress] == [1, 1] and 0 <= progress[0][0] < progress[1][0] < 1, progress
    assert not (toy_repo.parent / "x.txt").exists() and (toy_repo / "a.txt").read_text() == "hello\n"
    acted = [e for e in store.read_events(run_id) if e["type"] == "agent_acted"]
    assert len(acted) == 15 and all(e["actor"] == "agent" and e["data"]["call_id"].startswith("mcp-") for e in acted)
    assert sum(e["data"]["outcome"].startswith("refused: ") for e in acted) == 7
    assert cli("audit", run_id, state_dir=state_dir).returncode == 0


@pytest.mark.slow
def test_orchestrator_mcp_subprocess_over_stdio(agent_env: None, toy_repo: Path, state_dir: Path) -> None:
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(command=sys.executable, cwd=str(ROOT), env=dict(os.environ),
                                   args=["-m", "orchestrator.cli", "mcp", "--state-dir", str(state_dir)])

    async def scenario() -> str:
        async with Client(params, read_timeout_seconds=120) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert names == set(TOOLS)
            run_id = (await call(client, "start_run", workflow="agenttoy", options={"target": str(toy_repo)})
                      )["data"]["run_id"]
            assert (await call(client, "advance", run_id=run_id))["status"] == "waiting_for_human"
            refused = await call(client, "answer", run_id=run_id, key="color", value="blue")
            assert "waiting for a human" in refused["message"]
            escape = await call(client, "read_file", run_id=run_id, path="../../etc/passwd")
            assert escape["status"] == "refused" and "'..'" in escape["message"]
            return run_id

    run_id = anyio.run(scenario)
    state = RunStore(state_dir).read_state(run_id)
    assert state["awaiting"] == "human" and "color" not in state["answers"]
    status = cli("status", run_id, state_dir=state_dir)
    assert status.returncode == 3
    assert cli("audit", run_id, state_dir=state_dir).returncode == 0


def test_edit_file_replaces_once_and_read_file_returns_plain_text(agent_env: None, toy_repo: Path,
                                                                   state_dir: Path) -> None:
    from mcp import Client

    from orchestrator.agent.mcp_server import build_server

    store = RunStore(state_dir)
    run_id = engine.start("agenttoy", {"target": str(toy_repo), "color": "red"}, store=store).run_id

    async def scenario() -> None:
        async with Client(build_server(store)) as client:
            for _ in range(3):
                moved = await call(client, "advance", run_id=run_id)
            assert moved["data"]["phase"] == "fix", moved
            read = await client.call_tool("read_file", {"run_id": run_id, "path": "allowed/README"})
            assert [b.text for b in read.content[1:]] == ["edit here\n"]
            assert answer_of(read)["data"]["total_chars"] == 10 and "text" not in answer_of(read)["data"]
            assert (await call(client, "write_file", run_id=run_id, path="allowed/fixed.txt", content="ok\nok\n")
                    )["status"] == "ok"
            refusals = {"allowed/fixed.txt:missing": "is not in", "allowed/fixed.txt:ok": "matches 2 times",
                        "a.txt:hello": "outside the paths", "allowed/../a.txt:hello": "'..'",
                        "allowed/none.txt:x": "is not a file"}
            for where, expected in refusals.items():
                path, old = where.split(":")
                refused = await call(client, "edit_file", run_id=run_id, path=path, old_string=old, new_string="y")
                assert refused["status"] == "refused" and expected in refused["message"], refused
            edited = await call(client, "edit_file", run_id=run_id, path="allowed/fixed.txt",
                                old_string="ok\nok", new_string="ok\nfine")
            assert edited["status"] == "ok" and edited["data"]["line"] == 1, edited
            assert (await call(client, "advance", run_id=run_id))["data"]["status"] == "done"

    anyio.run(scenario)
    assert (toy_repo / "allowed" / "fixed.txt").read_text() == "ok\nfine\n"
    assert (toy_repo / "a.txt").read_text() == "hello\n"
    edits = [e["data"] for e in store.read_events(run_id)
             if e["type"] == "agent_acted" and e["data"]["tool"] == "edit_file"]
    assert [d["outcome"].split(":")[0] for d in edits] == ["refused"] * 5 + ["ok"]
    assert cli("audit", run_id, state_dir=state_dir).returncode == 0


def test_an_agent_without_a_shell_commits_a_candidate_branch_and_submits_it(
        monkeypatch: pytest.MonkeyPatch, toy_repo: Path, state_dir: Path) -> None:
    import git
    from mcp import Client

    from orchestrator.agent.mcp_server import build_server

    monkeypatch.setenv("ORCHESTRATOR_WORKFLOWS", f"{AGENT_TOY_REF},branchy=tests.toyflow.branchflow:WORKFLOW")
    store = RunStore(state_dir)
    toy_id = engine.start("agenttoy", {"target": str(toy_repo), "color": "red"}, store=store).run_id

    async def scenario() -> str:
        async with Client(build_server(store)) as client:
            for _ in range(3):
                await call(client, "advance", run_id=toy_id)
            no_branch = await call(client, "commit_branch", run_id=toy_id, branch="b", message="m")
            assert no_branch["status"] == "refused" and "takes no branch" in no_branch["message"], no_branch
            run_id = (await call(client, "start_run", workflow="branchy", options={"target": str(toy_repo)})
                      )["data"]["run_id"]
            waiting = await call(client, "advance", run_id=run_id)
            assert waiting["data"]["awaiting"] == "agent", waiting
            empty = await call(client, "commit_branch", run_id=run_id, branch="candidate/fix", message="fix")
            assert empty["status"] == "refused" and "no edits under the allowed paths" in empty["message"], empty
            wrote = await call(client, "write_file", run_id=run_id, path="allowed/fixed.txt", content="fixed\n")
            # the trial of 2026-12-04 was told to "call advance" in a phase that takes a branch
            assert "call advance" not in wrote["message"] and "then commit_branch and submit kind='candidate'" in \
                wrote["message"], wrote
            await call(client, "edit_file", run_id=run_id, path="allowed/README", old_string="edit", new_string="ed")
            engines = await call(client, "commit_branch", run_id=run_id, branch="stack/1-x", message="fix")
            assert engines["status"] == "refused" and "the engine's" in engines["message"]
            made = await call(client, "commit_branch", run_id=run_id, branch="candidate/fix", message="write the fix")
            assert made["status"] == "ok" and made["data"]["files"] == ["allowed/README", "allowed/fixed.txt"], made
            assert "submit kind='candidate'" in made["message"]
            await call(client, "submit", run_id=run_id, kind="candidate", args={"branch": "main", "label": "nothing"})
            explained = (await call(client, "explain", run_id=run_id))["data"]
            assert explained["outcome"]["candidate_submitted"]["count"] == 1, explained["outcome"]
            assert explained["outcome"]["candidate_submitted"]["latest"][0]["branch"] == "main"
            assert explained["phase_findings"] == {} and explained["issues"][0]["code"] == "candidate_wanted"
            assert explained["submissions"]["candidate"]["may_run_phases"] == ["pick"]
            asked = await call(client, "escalate", run_id=run_id, question="Is main a fair candidate?", key="fair")
            assert "The engine cannot act on it" in asked["message"], asked
            assert f"orchestrator resume {run_id} --waive candidate_wanted --reason TEXT" in asked["message"]
            assert f"orchestrator abort {run_id} --reason TEXT" in asked["message"]
            assert asked["data"]["engine_acts_on_answer"] is False
            resumed = cli("resume", run_id, "--answer", "fair=no", state_dir=state_dir)
            assert "cannot act on an agent's question" in resumed.stdout + resumed.stderr, resumed
            assert store.read_state(run_id)["phase"] == "pick"
            again = await call(client, "commit_branch", run_id=run_id, branch="candidate/fix", message="again")
            assert again["status"] == "refused" and "already exists" in again["message"]
            clean = await call(client, "commit_branch", run_id=run_id, branch="candidate/two", message="again")
            assert clean["status"] == "refused" and "no edits" in clean["message"]  # the checkout was restored
            done = await call(client, "submit", run_id=run_id, kind="candidate",
                              args={"branch": "candidate/fix", "label": "the fix"})
            assert done["data"]["status"] == "done", done
            return run_id

    run_id = anyio.run(scenario)
    repo = git.Repo(toy_repo)
    assert repo.active_branch.name == "main" and not repo.is_dirty(untracked_files=True)
    assert repo.git.show("candidate/fix:allowed/fixed.txt") == "fixed"
    assert repo.commit("candidate/fix").parents[0] == repo.head.commit
    acted = [e["data"] for e in store.read_events(run_id) if e["type"] == "agent_acted"]
    assert [a["tool"] for a in acted if a["tool"] == "commit_branch"] == ["commit_branch"] * 5
    for run in (run_id, toy_id):
        assert cli("audit", run, state_dir=state_dir).returncode == 0


def test_over_stdio_progress_comes_as_notifications_and_reads_never_wait_on_a_held_run(
        agent_env: None, toy_repo: Path, state_dir: Path) -> None:
    import subprocess
    import time

    from mcp import Client, StdioServerParameters

    from tests.test_reliability_agent import HOLD_LOCK

    env = {**os.environ, "ORCHESTRATOR_WORKFLOWS": AGENT_TOY_REF, "ORCHESTRATOR_BUSY_WAIT_S": "1"}
    params = StdioServerParameters(command=sys.executable, cwd=str(ROOT), env=env,
                                   args=["-m", "orchestrator.cli", "mcp", "--state-dir", str(state_dir)])
    store = RunStore(state_dir)
    run_id = engine.start("agenttoy", {"target": str(toy_repo), "color": "red"}, store=store).run_id
    progress: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(message or "")

    async def scenario() -> dict[str, float]:
        async with Client(params, read_timeout_seconds=120) as client:
            for _ in range(3):
                await client.call_tool("advance", {"run_id": run_id}, progress_callback=on_progress)
            holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(store.run_dir(run_id) / ".lock"), "6"],
                                      stdout=subprocess.PIPE)
            assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
            waited = {}
            for tool, extra in (("status", {}), ("explain", {}), ("read_file", {"path": "allowed/README"})):
                began = time.monotonic()
                answer = await call(client, tool, run_id=run_id, **extra)
                waited[tool] = time.monotonic() - began
                assert answer["status"] == "ok" and "not in the trail" in answer["message"], answer
            busy = await call(client, "write_file", run_id=run_id, path="allowed/fixed.txt", content="ok\n")
            assert busy["status"] == "refused" and "busy" in busy["message"] and "nothing was done" in busy["message"]
            holder.wait(timeout=30)
            assert "not in the trail" not in (await call(client, "status", run_id=run_id))["message"]
            return waited

    waited = anyio.run(scenario)
    assert max(waited.values()) < 3, waited
    assert any("worker" in m for m in progress) and any("work: squaring | phase step 1 of 1" in m for m in progress)
    acted = [e["data"]["tool"] for e in store.read_events(run_id) if e["type"] == "agent_acted"]
    assert acted == ["advance"] * 3 + ["status"]  # the busy calls said they were not recorded
    assert cli("audit", run_id, state_dir=state_dir).returncode == 0


def test_file_tool_refusals_are_tool_errors_that_say_nothing_changed(agent_env: None, toy_repo: Path,
                                                                     state_dir: Path) -> None:
    from mcp import Client

    from orchestrator.agent.mcp_server import build_server

    store = RunStore(state_dir)
    run_id = engine.start("agenttoy", {"target": str(toy_repo), "color": "red"}, store=store).run_id
    (toy_repo / "allowed" / "twice.txt").write_text("ok\nok\n")

    async def scenario() -> dict[str, Any]:
        async with Client(build_server(store)) as client:
            for _ in range(3):
                await call(client, "advance", run_id=run_id)
            twice = await client.call_tool("edit_file", {"run_id": run_id, "path": "allowed/twice.txt",
                                                         "old_string": "ok", "new_string": "fine"})
            assert twice.is_error, twice
            others = {"write_file": {"path": "a.txt", "content": "x\n"},
                      "apply_diff": {"diff": "--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-hello\n+bye\n"},
                      "edit_file": {"path": "allowed/twice.txt", "old_string": "gone", "new_string": "x"}}
            said = {tool: await client.call_tool(tool, {"run_id": run_id, **args}) for tool, args in others.items()}
            assert all(result.is_error for result in said.values()), said
            return {"twice": answer_of(twice), **{tool: answer_of(result) for tool, result in said.items()}}

    answers = anyio.run(scenario)
    twice = answers["twice"]
    assert twice["message"].startswith("edit NOT made: old_string matches 2 times"), twice
    assert "more surrounding context" in twice["message"] and twice["data"]["matches"] == 2, twice
    assert twice["data"]["code"] == "edit_not_unique", twice
    gone = answers["edit_file"]
    assert gone["message"].startswith("edit NOT made: old_string is not in 'allowed/twice.txt'"), answers
    assert gone["data"]["code"] == "edit_no_match" and gone["data"]["matches"] == 0, gone
    assert answers["write_file"]["message"].startswith("file NOT written: "), answers
    assert answers["apply_diff"]["message"].startswith("diff NOT applied: "), answers
    assert (toy_repo / "allowed" / "twice.txt").read_text() == "ok\nok\n"
    assert (toy_repo / "a.txt").read_text() == "hello\n"


PARSE_TOY_REF = f"{AGENT_TOY_REF},parsetoy=tests.toyflow.parseflow:WORKFLOW"


def test_parallel_advances_on_four_runs_over_one_server_all_complete(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    """Seen by a new user: two advances at once crashed one with "SystemError: AST constructor recursion depth
    mismatch" (the guard's ast.parse in two threads of the server). Each phase here reads a large file's AST as the
    guard does; in threads of one process one of the four would crash."""
    from mcp import Client

    from orchestrator.agent.mcp_server import build_server
    from tests.conftest import make_repo

    monkeypatch.setenv("ORCHESTRATOR_WORKFLOWS", PARSE_TOY_REF)
    store = RunStore(tmp_path / "state")
    runs = []
    for index in range(4):
        make_repo(tmp_path / f"target-{index}", {"a.txt": "hello\n"})
        runs.append(engine.start("parsetoy", {"target": str(tmp_path / f"target-{index}")}, store=store).run_id)

    async def scenario() -> list[dict[str, Any]]:
        answers: list[dict[str, Any]] = []
        async with Client(build_server(store)) as client:
            async def advance(run_id: str) -> None:
                answers.append(answer_of(await client.call_tool("advance", {"run_id": run_id})))

            async with anyio.create_task_group() as group:
                for run_id in runs:
                    group.start_soon(advance, run_id)
        return answers

    answers = anyio.run(scenario)
    assert [a["data"]["status"] for a in answers] == ["done"] * 4, answers
    for run_id in runs:
        assert cli("audit", run_id, state_dir=tmp_path / "state").returncode == 0



def test_two_advances_at_once_on_one_run_one_acts_and_the_other_is_refused_as_busy(
        monkeypatch: pytest.MonkeyPatch, toy_repo: Path, state_dir: Path) -> None:
    from mcp import Client

    from orchestrator.agent.mcp_server import build_server

    monkeypatch.setenv("ORCHESTRATOR_WORKFLOWS", AGENT_TOY_REF)
    monkeypatch.setenv("ORCHESTRATOR_BUSY_WAIT_S", "1")
    store = RunStore(state_dir)
    run_id = engine.start("agenttoy", {"target": str(toy_repo), "color": "red", "worker": "slow", "sleep": 6,
                                       "marker": str(toy_repo.parent / "marker")}, store=store).run_id
    engine.advance(run_id, store=store, max_phases=1)  # the answered question: the run is at the slow worker now

    async def scenario() -> list[dict[str, Any]]:
        answers: list[dict[str, Any]] = []
        async with Client(build_server(store)) as client:
            async def advance() -> None:
                answers.append(answer_of(await client.call_tool("advance", {"run_id": run_id})))

            async with anyio.create_task_group() as group:
                group.start_soon(advance)
                group.start_soon(advance)
        return answers

    answers = sorted(anyio.run(scenario), key=lambda a: a["status"])
    assert [a["status"] for a in answers] == ["ok", "refused"], answers
    assert "busy" in answers[1]["message"] and "nothing was done" in answers[1]["message"]
    assert answers[0]["data"]["phase"] == "fix"
    assert [e["data"]["tool"] for e in store.read_events(run_id) if e["type"] == "agent_acted"] == ["advance"]
    assert cli("audit", run_id, state_dir=state_dir).returncode == 0

def test_a_person_answers_the_preflight_questions_right_after_start_run(tmp_path: Path) -> None:
    """Seen by a new user: right after start_run, explain listed "pre-flight question 'branch' unanswered", yet
    `orchestrator resume RUN --answer branch=new` said "no pending question 'branch'" (exit 2) until the agent's
    first advance. Questions known at start are asked at start: explain and the CLI list the same ones, and a
    person's answer is taken at once; they stay a person's."""
    from mcp import Client

    from orchestrator.agent.mcp_server import build_server

    state = tmp_path / "state"
    store = RunStore(state)

    async def scenario() -> str:
        async with Client(build_server(store)) as client:
            options = {"model": "type:qwen3_moe", "device": "cpu", "torchrun_rows": "skip"}
            run_id = (await call(client, "start_run", workflow="add-moe-model", options=options))["data"]["run_id"]
            explained = (await call(client, "explain", run_id=run_id))["data"]
            keys = [q["key"] for q in explained["pending"]]
            assert keys == ["branch", "commit"] and all("a human only" in q["who"] for q in explained["pending"])
            assert [q["key"] for q in json.loads(cli("status", run_id, "--json", state_dir=state).stdout)["pending"]
                    ] == keys
            assert all(any(f"'{k}'" in reason for k in keys) for reason in explained["blocking_next_phase"])
            refused = await call(client, "answer", run_id=run_id, key="branch", value="current")
            assert refused["status"] == "refused" and "waiting for a human" in refused["message"]
            answered = cli("resume", run_id, "--answer", "branch=new", "--answer", "commit=never", "--no-advance",
                           state_dir=state)
            assert answered.returncode == 0, answered.stderr
            explained = (await call(client, "explain", run_id=run_id))["data"]
            assert explained["pending"] == [] and explained["blocking_next_phase"] == []
            assert explained["why"] == "phase preflight is ready to run; call advance"
            return run_id

    run_id = anyio.run(scenario)
    assert store.read_state(run_id)["answers"] == {"branch": "new", "commit": "never"}
    assert cli("audit", run_id, state_dir=state).returncode == 0


FOUR_MODELS = ("qwen3_moe", "granitemoe", "hunyuan_v1_moe", "glm4_moe")
EDIT = {"path": "torchtitan/experiments/transformers_modeling_backend/moe_replacement.py",
        "old_string": "from functools import partial\n",
        "new_string": "from functools import partial  # read by the agent\n"}


@pytest.mark.slow
def test_four_add_moe_runs_advanced_at_once_over_stdio_all_complete_and_audit(tmp_path: Path) -> None:
    """Four real add-moe-model runs through one `orchestrator mcp` and one real client, every call sent for all
    four at once: starts, the agent's edits (which the forbidden-calls guard then reads as an AST at every advance),
    advances until each run is done or waits on its findings. A person answers the human-only questions with the
    CLI as soon as they are asked. Every call answers, every notification carries a total, every trail audits."""
    from mcp import Client, StdioServerParameters

    state = tmp_path / "state"
    params = StdioServerParameters(command=sys.executable, cwd=str(ROOT), env=dict(os.environ),
                                   args=["-m", "orchestrator.cli", "mcp", "--state-dir", str(state)])
    progress: list[tuple[float, float | None, str]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total, message or ""))

    async def at_once(calls: dict[str, Any]) -> dict[str, dict[str, Any]]:
        answers: dict[str, dict[str, Any]] = {}

        async def one(key: str, call_: Any) -> None:
            answers[key] = answer_of(await call_)

        async with anyio.create_task_group() as group:
            for key, call_ in calls.items():
                group.start_soon(one, key, call_)
        return answers

    def person_answers(run_id: str, *answers: str) -> None:
        done = cli("resume", run_id, *[a for pair in answers for a in ("--answer", pair)], "--no-advance",
                   state_dir=state)
        assert done.returncode in (0, 3), done.stderr

    async def scenario() -> dict[str, dict[str, Any]]:
        async with Client(params, read_timeout_seconds=1800) as client:
            options = {"device": "cpu", "torchrun_rows": "skip"}
            started = await at_once({m: client.call_tool("start_run", {"workflow": "add-moe-model", "options": {
                **options, "model": f"type:{m}"}}) for m in FOUR_MODELS})
            runs = {m: a["data"]["run_id"] for m, a in started.items()}
            for run_id in runs.values():
                person_answers(run_id, "branch=current", "commit=never")
            ended: dict[str, dict[str, Any]] = {}
            for round_ in range(12):
                live = {m: r for m, r in runs.items() if m not in ended}
                if not live:
                    break
                if round_ == 1:  # in the probe now, where the experiment folder may be edited
                    edits = await at_once({m: client.call_tool("edit_file", {"run_id": r, **EDIT})
                                           for m, r in live.items()})
                    assert [e["status"] for e in edits.values()] == ["ok"] * len(live), edits
                moved = await at_once({m: client.call_tool("advance", {"run_id": r}, progress_callback=on_progress)
                                       for m, r in live.items()})
                for model, answer in moved.items():
                    assert answer["status"] in ("ok", "waiting_for_human"), answer
                    data = answer["data"]
                    if [q["key"] for q in data["pending"]] == ["unrun_rows"]:
                        person_answers(runs[model], "unrun_rows=accept")
                    elif data["status"] == "done" or data["awaiting"] in ("agent", "human"):
                        ended[model] = data
            return ended

    ended = anyio.run(scenario)
    assert set(ended) == set(FOUR_MODELS) and ended["qwen3_moe"]["status"] == "done", ended
    assert all(d["status"] != "failed" for d in ended.values()), ended
    for data in ended.values():
        assert cli("audit", data["run_id"], state_dir=state, timeout=300).returncode == 0
    assert progress and [(t, m) for _, t, m in progress if t is None or "| phase step " not in m] == []
    assert any(re.search(r"ETA \d", m) for _, _, m in progress), progress
