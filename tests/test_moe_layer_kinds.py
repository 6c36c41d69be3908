"""Every kind of decoder layer is built and checked, on a real run of a hybrid model (bailing_hybrid, CPU).

Blind trial: bailing_hybrid (42 layers: Kimi delta attention, MLA every 6th layer, two dense layers first)
reached `done` with a fix for its linear layers alone; its MLA layers were never built, by the probe (up to
the first MoE layer), the synthetic entry (one linear layer) or the build check. Here the same partial fix
(tests/moe_reference_fixes_layers.py, as the trial's agent wrote it) is stopped by a finding that names the
full-attention layers, and the fix of both kinds reaches `done` with a table saying which phase built and
checked each kind. The build check's share is also shown standing on the partial fix, by layer and kind.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import engine
from orchestrator.trail.store import RunStore
from phases.add_moe_model.workspace import new_run_workspace
from tests import moe_reference_fixes_layers as fixes
from tests.conftest import call_worker

pytestmark = pytest.mark.slow
MLA_LAYERS = "layers 5, 11, 17, 23, 29, 35, 41"
KINDS = ["linear (linear_attention) x dense", "linear (linear_attention) x moe", "mla (full_attention) x moe"]


def test_bailing_hybrid_with_a_fix_for_its_linear_layers_alone_stops_and_with_both_reaches_done(
        tmp_path: Path) -> None:
    store = RunStore(tmp_path / "state")
    run_id = engine.start("add-moe-model", {"model": "type:bailing_hybrid", "branch": "current", "commit": "never",
                                            "unrun_rows": "accept", "device": "cpu"}, store=store).run_id
    target = Path(engine.advance(run_id, store=store).state["target"])

    fixes.linear_layers(target)
    stopped = engine.advance(run_id, store=store)
    state = stopped.state
    assert (state["phase"], state["awaiting"], stopped.exit_code) == ("probe", "agent", 4), state["summary"]
    (issue,) = state["issues"]
    assert issue["code"] == "attention_projection_unhandled"
    assert issue["message"].startswith(f"[fixable] kind 'mla (full_attention) x moe' at {MLA_LAYERS}: layer 5:")
    assert issue["fix_location"].endswith("hf_sharding.py (_set_layer_sharding_configs)")

    fixes.mla_layers(target)
    done = engine.advance(run_id, store=store).state
    assert done["status"] == "done", done["summary"]
    results = done["results"]
    assert [k["name"] for k in results["probe"]["layer_kinds"]] == KINDS
    assert [p["kind"] for p in results["synthetic_config"]["layers"]] == KINDS
    assert all(r["status"] == "PASS" for r in results["parallelism"]["build_check"])
    rows = {r["kind"]: r for r in results["compat_doc"]["values"]["layer_kinds"]}
    assert list(rows) == KINDS and rows[KINDS[2]]["layers"] == MLA_LAYERS.removeprefix("layers ")
    assert all(r["probe"] == "PASS" and r["build_check"] == "world 2 PASS, world 4 PASS, world 8 PASS"
               for r in rows.values()), rows
    assert (rows[KINDS[2]]["synthetic_layer"], rows[KINDS[1]]["numerics"].split(" (")[0]) == (2, "MoE block compared")
    doc = (store.run_dir(run_id) / "artifacts" / "MODEL_COMPATIBILITY.md").read_text()
    assert f"  - mla (full_attention) x moe: {MLA_LAYERS} (" in doc, doc
    assert "    - synthetic entry layer 2 (synthetic_config, seq " in doc and \
           "sharding build check world 2 PASS, world 4 PASS, world 8 PASS (parallelism, seq " in doc, doc


def test_the_build_check_names_the_kind_it_failed_on(tmp_path: Path) -> None:
    """On the partial fix, the synthetic entry's MLA layer (2) fails the target's sharding setup at every world
    size; the parallelism phase's finding names its kind and the real layers it stands for."""
    from phases.add_moe_model.layer_table import kinds_of_layers
    from phases.add_moe_model.model_source import resolve_model_source
    from phases.add_moe_model.parallelism import build_check_issue
    from phases.add_moe_model.records import Results

    target = new_run_workspace(tmp_path / "state")
    fixes.linear_layers(target)
    source = {"source": resolve_model_source("type:bailing_hybrid").model_dump(mode="json")}
    probe = call_worker("phases.add_moe_model.work.probe:probe", source, target=target)["report"]
    synthetic = call_worker("phases.add_moe_model.work.synthetic:build_synthetic", source, target=target)
    out = call_worker("phases.add_moe_model.work.build_check:build_check",
                      {"model_type": "bailing_hybrid", "config_kwargs": synthetic["entry"], "world_sizes": [2]},
                      target=target)
    (row,) = out["results"]
    assert (row["status"], row["failed_layers"]) == ("FAIL", [2]), row
    results = Results.model_validate({"probe": probe, "synthetic_config": synthetic})
    issue = build_check_issue(row, kinds=kinds_of_layers(results, row["failed_layers"]))
    assert f"[failed on synthetic layer 2 holds 'mla (full_attention) x moe' (real {MLA_LAYERS})]" in issue.message
