"""A real fix cycle driven by our Anthropic loop on the embedded torchtitan workspace.

torchtitan 0.3.0's adapter maps DeepSeek-V3's ``gate.e_score_correction_bias`` to
``expert_bias`` while Titan's MoE names the buffer ``expert_bias_E``: the probe reports
``router_bias_key_misnamed``. The scripted model first tries two forbidden edits (a core
file and the frozen numerics script), both refused; then fixes the adapter with edit_file
and advances until numerics has run. The whole dialogue is in the trail.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator import engine
from orchestrator.agent.driver import drive
from orchestrator.trail.store import RunStore
from tests.conftest import cli
from tests.test_agent_driver import ScriptedModel, assert_secret_absent

pytestmark = pytest.mark.slow
ADAPTER = "torchtitan/experiments/transformers_modeling_backend/state_dict_adapter.py"
NE = ("torchtitan/experiments/transformers_modeling_backend/.claude/skills/add_moe_model/scripts/"
      "numerical_equivalence.py")


def bias_edits(target: Path) -> list[tuple[str, str]]:
    """The one-word fix as two exact replacements (edit_file): both pattern tables name expert_bias_E."""
    text = (target / ADAPTER).read_text()
    edits = [(r'r"\1expert_bias", False)', r'r"\1expert_bias_E", False)'),
             (r'(r"^(.*\.)expert_bias$",', r'(r"^(.*\.)expert_bias_E$",')]
    assert all(text.count(old) == 1 for old, _ in edits), "the adapter's patterns changed upstream"
    return edits


def core_edit(target: Path) -> str:
    path = "torchtitan/models/common/moe.py"
    first = (target / path).read_text().splitlines(True)[0]
    return f"--- a/{path}\n+++ b/{path}\n@@ -1 +1,2 @@\n {first}+# loosen the router\n"


def test_agent_fixes_the_bias_key_and_numerics_runs(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    store = RunStore(state_dir)
    run_id = engine.start("add-moe-model", {"model": "deepseek-ai/DeepSeek-V3", "branch": "current",
                                            "commit": "never", "device": "cpu"}, store=store).run_id
    waiting = engine.advance(run_id, store=store)
    assert waiting.exit_code == 4 and "router_bias_key_misnamed" in {i["code"] for i in waiting.state["issues"]}
    target = Path(waiting.state["target"])
    model = ScriptedModel(run_id, [
        lambda r: [("explain", {"run_id": r})],
        lambda r: [("apply_diff", {"run_id": r, "diff": core_edit(target)}),
                   ("write_file", {"run_id": r, "path": NE, "content": "KL_PASS = 1.0\n"})],
        lambda r: [("edit_file", {"run_id": r, "path": ADAPTER, "old_string": old, "new_string": new})
                   for old, new in bias_edits(target)],
        lambda r: [("advance", {"run_id": r})],
        lambda r: [("advance", {"run_id": r})],
        lambda r: [("advance", {"run_id": r})],
        lambda r: "numerics ran; stopping here",
    ])
    result = drive(run_id, store=store, client=model.client(), model="claude-test", max_turns=10)
    assert result.tool_calls == 8, result
    acted = [e["data"] for e in store.read_events(run_id) if e["type"] == "agent_acted"]
    outcomes = [a["outcome"].split(":")[0] for a in acted]
    assert outcomes[:5] == ["ok", "refused", "refused", "ok", "ok"], outcomes
    assert "outside the paths" in acted[1]["outcome"] and "frozen" in acted[2]["outcome"]
    assert not (target / NE).exists()
    assert "expert_bias_E" in (target / ADAPTER).read_text()
    state = store.read_state(run_id)
    probe = state["results"]["probe"]
    assert probe["strict_load"] == "PASS" and not probe["issues"], probe["issues"]
    assert "numerics" in state["results"], state["summary"]
    verdict = state["results"]["numerics"]["verdict"]
    assert verdict["status"] in ("PASS", "WARN", "FAIL") and verdict["roundtrip"]["status"] == "PASS"
    first_system = model.requests[0]["system"]
    assert "router_bias_key_misnamed" in first_system and "experiments/transformers_modeling_backend" in first_system
    assert_secret_absent(state_dir)
    audit = cli("audit", run_id, "--json", state_dir=state_dir)
    assert audit.returncode == 0 and json.loads(audit.stdout)["ok"], audit.stdout
