"""Reliability: an agent that cheats, through the real MCP client talking to `orchestrator mcp` over stdio.

Every cheat must be refused, every acting call recorded (or refused as busy before acting), and the
trail must audit clean. Plus the check-path hook's fail-closed payloads and the AST forbidden-calls guard.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestrator.trail.store import RunStore
from tests.conftest import ROOT, cli, make_repo
from tests.test_agent_mcp import call
from tests.test_agent_tools import AGENT_TOY_REF

HOLD_LOCK = "import filelock, sys, time; l = filelock.FileLock(sys.argv[1]); l.acquire(); print('held', flush=True); " \
            "time.sleep(float(sys.argv[2]))"


def diff_creating_link() -> str:
    return ("diff --git a/allowed/evil b/allowed/evil\nnew file mode 120000\nindex 0000000..1111111\n"
            "--- /dev/null\n+++ b/allowed/evil\n@@ -0,0 +1 @@\n+/etc\n\\ No newline at end of file\n")


def diff_changing_mode() -> str:
    return "diff --git a/allowed/README b/allowed/README\nold mode 100644\nnew mode 100755\n"


def diff_renaming_out() -> str:
    return ("diff --git a/a.txt b/allowed/a.txt\nsimilarity index 100%\nrename from a.txt\nrename to allowed/a.txt\n")


def test_agent_cheats_over_stdio_are_refused_and_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mcp import Client, StdioServerParameters

    monkeypatch.setenv("ORCHESTRATOR_WORKFLOWS", AGENT_TOY_REF)
    target, state = tmp_path / "target", tmp_path / "state"
    make_repo(target, {"a.txt": "hello\n", "allowed/README": "edit here\n"})
    (target / "allowed" / "outside").symlink_to(tmp_path)
    env = {**os.environ, "ORCHESTRATOR_WORKFLOWS": AGENT_TOY_REF, "ORCHESTRATOR_BUSY_WAIT_S": "1"}
    params = StdioServerParameters(command=sys.executable, cwd=str(ROOT), env=env,
                                   args=["-m", "orchestrator.cli", "mcp", "--state-dir", str(state)])
    held: dict[str, bool] = {}

    def refused(name: str, answer: dict[str, Any]) -> None:
        held[name] = answer["status"] in ("refused", "error")

    async def scenario() -> str:
        async with Client(params, read_timeout_seconds=120) as client:
            opts = {"target": str(target)}
            refused("start_run answering a human-only option",
                    await call(client, "start_run", workflow="agenttoy", options={**opts, "color": "red"}))
            held["no run made by the refused start"] = not (state / "runs").exists() or not any(
                p for p in (state / "runs").iterdir() if not p.name.startswith("."))
            run_id = (await call(client, "start_run", workflow="agenttoy", options=opts))["data"]["run_id"]
            await call(client, "advance", run_id=run_id)
            refused("answer a human-only question",
                    await call(client, "answer", run_id=run_id, key="color", value="red"))
            refused("escalate with a human-only key", await call(client, "escalate", run_id=run_id, question="Color?",
                                                                  key="color", choices=["red"]))
            refused("answer an unasked question", await call(client, "answer", run_id=run_id, key="shade", value="x"))
            await call(client, "escalate", run_id=run_id, question="Which shade?", key="shade")
            resumed = cli("resume", run_id, "--answer", "color=red", "--answer", "shade=dark", state_dir=state)
            assert resumed.returncode == 4, resumed.stderr  # a person answered both; the run waits in fix
            for path in ("a.txt", "../x.txt", ".git/config", "allowed/outside/x.txt", "/etc/x", "allowed/../a.txt"):
                refused(f"write_file {path}", await call(client, "write_file", run_id=run_id, path=path, content="x"))
            for name, diff in (("a symlink", diff_creating_link()), ("a mode change", diff_changing_mode()),
                               ("a rename out of scope", diff_renaming_out())):
                refused(f"apply_diff with {name}", await call(client, "apply_diff", run_id=run_id, diff=diff))
            refused("read_artifact outside artifacts/",
                    await call(client, "read_artifact", run_id=run_id, name="../run.json"))
            lock = state / "runs" / run_id / ".lock"
            holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(lock), "4"], stdout=subprocess.PIPE)
            assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
            busy = await call(client, "write_file", run_id=run_id, path="allowed/fixed.txt", content="ok\n")
            held["a call while the run is held is refused as busy, not acted on"] = (
                busy["status"] == "refused" and "busy" in busy["message"]
                and not (target / "allowed" / "fixed.txt").exists())
            holder.wait(timeout=30)
            assert (await call(client, "write_file", run_id=run_id, path="allowed/fixed.txt", content="ok\n")
                    )["status"] == "ok"
            assert (await call(client, "advance", run_id=run_id))["data"]["status"] == "done"
            return run_id

    run_id = anyio.run(scenario)
    store = RunStore(state)
    trail = store.read_events(run_id)
    acted = [e["data"] for e in trail if e["type"] == "agent_acted"]
    state_now = store.read_state(run_id)
    held["a person's answer to the agent's question stays apart"] = (
        state_now["answers"] == {"color": "red"} and state_now["agent_answers"] == {"shade": "dark"})
    escaped = (tmp_path / "x.txt").exists() or (target / "allowed" / "evil").exists()
    held["nothing escaped the target"] = not escaped
    held["a.txt untouched"] = (target / "a.txt").read_text() == "hello\n"
    held["every refusal after start is recorded"] = sum(a["outcome"].startswith("refused: ") for a in acted) == 13
    written = [a["arguments"]["path"] for a in acted if a["tool"] == "write_file" and a["outcome"] == "ok"]
    held["only the one write that happened is recorded as done"] = written == ["allowed/fixed.txt"]
    held["audit clean"] = cli("audit", run_id, state_dir=state).returncode == 0
    assert all(held.values()), {k: v for k, v in held.items() if not v}


PAYLOADS = {
    "not JSON": "not json", "a JSON list": "[]", "an empty object": "{}", "no tool_input": '{"tool_name": "Edit"}',
    "an Edit without a path": '{"tool_name": "Edit", "tool_input": {}}',
    "a path that is not a string": '{"tool_name": "Write", "tool_input": {"file_path": 5}}',
    "an empty path": '{"tool_name": "Write", "tool_input": {"file_path": ""}}',
    "a path outside scope": '{"tool_name": "Edit", "tool_input": {"file_path": "a.txt"}}',
}


@pytest.fixture(scope="module")
def fix_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    from orchestrator import engine

    root = tmp_path_factory.mktemp("hook")
    make_repo(root / "target", {"a.txt": "hello\n", "allowed/README": "edit here\n"})
    os.environ["ORCHESTRATOR_WORKFLOWS"] = AGENT_TOY_REF
    try:
        store = RunStore(root / "state")
        run_id = engine.start("agenttoy", {"target": str(root / "target"), "color": "red"}, store=store).run_id
        engine.advance(run_id, store=store)
    finally:
        os.environ["ORCHESTRATOR_WORKFLOWS"] = "toy=tests.toyflow:WORKFLOW"
    return root / "state", run_id


@pytest.mark.parametrize("name", list(PAYLOADS))
def test_check_path_fails_closed(fix_run: tuple[Path, str], name: str) -> None:
    state, run_id = fix_run
    env = {**os.environ, "ORCHESTRATOR_WORKFLOWS": AGENT_TOY_REF}
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "check-path", run_id, "--state-dir", str(state)],
                          input=PAYLOADS[name], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert proc.returncode == 2 and "refused" in proc.stderr, (proc.returncode, proc.stderr)


EXP = "torchtitan/experiments/transformers_modeling_backend"
CHEATS = {
    "a plain call": "def f(m, fn):\n    m.register_forward_hook(fn)\n",
    "getattr with a built string": "def f(m, fn):\n    getattr(m, 'register_' + 'forward_hook')(fn)\n",
    "getattr through names": "A = 'register_forward'\nB = A + '_pre_hook'\ndef f(m, fn):\n    getattr(m, B)(fn)\n",
    "an f-string": "P = 'parallelize'\ndef f(m):\n    return globals()[f'{P}_module']\n",
    "a join": "def f(m, fn):\n    getattr(m, ''.join(['register_forward', '_hook']))(fn)\n",
    "an aliased import": "from torch.distributed.tensor.parallel import parallelize_module as shard\n",
    "a module alias": "import torch.distributed.tensor.parallel as tp\ndef f(m):\n    tp.parallelize_module(m)\n",
    "a bound method alias": "def f(m, fn):\n    hook = m.register_forward_pre_hook\n    hook(fn)\n",
    "the private hook dict": "def f(m, fn):\n    m._forward_hooks[0] = fn\n",
    "format": "def f(m, fn):\n    getattr(m, 'register_{}_hook'.format('forward'))(fn)\n",
}


@pytest.mark.parametrize("name", list(CHEATS))
def test_forbidden_calls_guard_reads_the_ast(tmp_path: Path, name: str) -> None:
    from phases.add_moe_model.rules import forbidden_calls_guard

    pre_existing = "def g(m, cast):\n    m.register_forward_pre_hook(cast)\n"
    repo = make_repo(tmp_path / "t", {f"{EXP}/old.py": pre_existing, f"{EXP}/model.py": "X = 1\n"})
    state = {"target": str(tmp_path / "t"), "base": {"commit": repo.head.commit.hexsha}}
    assert forbidden_calls_guard(state) is None
    (tmp_path / "t" / EXP / "model.py").write_text("X = 1\n" + CHEATS[name])
    (tmp_path / "t" / EXP / "old.py").write_text(pre_existing + "\ndef h():\n    return 2\n")
    violation = forbidden_calls_guard(state)
    assert violation is not None and violation.paths == (f"{EXP}/model.py",), violation
    (tmp_path / "t" / EXP / "model.py").write_text('X = 1\n# no register_forward_hook here\n"""nor here"""\n')
    assert forbidden_calls_guard(state) is None  # comments and docstrings are not calls


def test_a_value_that_is_not_utf8_is_refused_and_recorded(fix_run: tuple[Path, str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.agent.tools import call_tool

    monkeypatch.setenv("ORCHESTRATOR_WORKFLOWS", AGENT_TOY_REF)
    state, run_id = fix_run
    store = RunStore(state)
    target = Path(store.read_state(run_id)["target"])
    result = call_tool("write_file", {"run_id": run_id, "path": "allowed/bad.txt", "content": "caf\udce9"},
                       store=store, call_id="surrogate")
    assert result.status == "refused" and not (target / "allowed" / "bad.txt").exists()
    recorded = [e["data"] for e in store.read_events(run_id) if e["type"] == "agent_acted"][-1]
    assert recorded["call_id"] == "surrogate" and recorded["arguments"]["content"] == "caf?"
