"""The correction-bias fix, written once: a second model type gets it offered, applies it, and is done.

Issue 40's trial: the same experiment-folder fix (the correction bias mapped to ``expert_bias_E``, not
``expert_bias``) was written from scratch in 3 of 5 runs. Here an agent ports DeepSeek-V3 through the
real tools and fixes the adapter by hand; the probe passes and the run moves on. Then our Anthropic
loop (a scripted model) ports glm4_moe, another model type whose probe raises the same finding at
another layer: the completion offers the first run's edit, the system prompt and explain show it,
one apply_fix applies it, and the run reaches done (CPU, torchrun rows skipped, a person's start
options). Real torchtitan 0.3.0 and transformers, real git, real trails.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator import engine
from orchestrator.agent.driver import drive
from orchestrator.trail.store import RunStore
from tests.conftest import cli
from tests.test_agent_driver import ScriptedModel
from tests.test_agent_moe_fix import ADAPTER, bias_edits
from tests.test_agent_tools import Caller

pytestmark = pytest.mark.slow
CODE = "router_bias_key_misnamed"
PERSON = {"branch": "current", "commit": "never", "unrun_rows": "accept", "torchrun_rows": "skip", "device": "cpu"}


def fixes_known(state_dir: Path) -> list[dict]:
    done = cli("fixes", "--json", state_dir=state_dir)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["fixes"]


def port_deepseek_by_hand(caller: Caller) -> str:
    run_id = engine.start("add-moe-model", {"model": "deepseek-ai/DeepSeek-V3", **PERSON}, store=caller.store).run_id
    while (waiting := caller("advance", run_id=run_id)).data["awaiting"] != "agent":
        assert waiting.data["phase"] in ("preflight", "probe"), waiting.message
    assert {i["code"] for i in waiting.data["issues"]} == {CODE}
    target = Path(waiting.data["target"])
    for old, new in bias_edits(target):
        assert caller("edit_file", run_id=run_id, path=ADAPTER, old_string=old, new_string=new).status == "ok"
    assert caller("advance", run_id=run_id).data["phase"] == "synthetic_config"
    return run_id


def test_the_second_model_applies_the_proven_bias_fix_and_reaches_done(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "state")
    first = port_deepseek_by_hand(Caller(store))
    [fix] = fixes_known(store.state_dir)
    assert [f["code"] for f in fix["findings"]] == [CODE] and fix["files"] == [ADAPTER]
    assert [(p["run_id"], p["phase"], p["by"]) for p in fix["proofs"]] == [(first, "probe", ["edit_file"])]

    second = engine.start("add-moe-model", {"model": "type:glm4_moe", **PERSON}, store=store).run_id
    model = ScriptedModel(second, [
        lambda r: [("advance", {"run_id": r})],
        lambda r: [("advance", {"run_id": r})],
        lambda r: [("explain", {"run_id": r})],
        lambda r: [("apply_fix", {"run_id": r, "offer": fix["offer"]})],
        *[lambda r: [("advance", {"run_id": r})]] * 10,
    ])
    result = drive(second, store=store, client=model.client(), model="claude-test", max_turns=14)
    assert result.stop_reason == "done", result.state["summary"]
    offered_in_prompt = [r["system"] for r in model.requests if fix["offer"] in r["system"]]
    assert offered_in_prompt and first in offered_in_prompt[0], "the loop's system prompt never showed the offer"
    events = store.read_events(second)
    [offer] = [e["data"] for e in events if e["type"] == "fix_offered"]
    assert offer["offer"] == fix["offer"] and offer["applies"] and [f["code"] for f in offer["findings"]] == [CODE]
    proving = store.read_events(first)[offer["proofs"][0]["raised_seq"]]["data"]["issues"][0]["message"]
    raised = next(e for e in events if e["type"] == "phase_completed" and e["phase"] == "probe")["data"]["issues"]
    assert proving != raised[0]["message"]  # another model: the same finding names another layer
    applied = [e["data"] for e in events if e["type"] == "agent_acted" and e["data"]["tool"] == "apply_fix"]
    assert [a["outcome"] for a in applied] == ["ok"]
    edits = [(e["phase"], e["data"]["by"], e["data"]["tool"], sorted(e["data"]["files"]))
             for e in events if e["type"] == "edit_recorded"]
    assert edits == [("probe", "tool", "apply_fix", [ADAPTER]),  # then the doc phase writes the model's section
                     ("compat_doc", "phase", None, [f"{ADAPTER.rsplit('/', 1)[0]}/MODEL_COMPATIBILITY.md"])]
    assert "expert_bias_E" in (Path(result.state["target"]) / ADAPTER).read_text()
    [proven] = fixes_known(store.state_dir)
    assert [p["run_id"] for p in proven["proofs"]] == [first, second]
    for run_id in (first, second):
        audit = cli("audit", run_id, "--json", state_dir=store.state_dir)
        assert audit.returncode == 0 and json.loads(audit.stdout)["ok"], audit.stdout
