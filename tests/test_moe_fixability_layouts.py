"""Fixability of the layout and key findings: a reference fix in the experiment folder clears each on a real run.

As in tests/test_moe_fixability.py, a run starts on the embedded torchtitan 0.3.0 workspace, the
probe's findings are seen standing, the reference fixes of tests/moe_reference_fixes_layouts.py are
applied inside the experiment folder, and one advance re-probes the fixed target (``max_phases=1``:
the findings are the probe's, a full run would add minutes for nothing more).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import engine
from orchestrator.trail.store import RunStore
from phases.add_moe_model.probe import BLOCKER_KEY
from tests import moe_reference_fixes as fixes
from tests import moe_reference_fixes_layouts as layouts
from tests.test_moe_fixability import _codes, _left_the_probe_clean, _reprobe, _start

pytestmark = pytest.mark.slow


def test_afmoe_round_trip_keys_router_and_norms_clear_and_the_run_leaves_the_probe(tmp_path: Path) -> None:
    """The round trip is judged on the target's own adapter: its reverse pattern sent the block's
    ``expert_bias`` to ``gate.e_score_correction_bias``, so HF -> Titan -> HF changed the keys."""
    store = RunStore(tmp_path / "state")
    run_id, target = _start(store, "type:afmoe")
    before = store.read_state(run_id)
    assert _codes(before) == {"roundtrip_failed", "state_dict_keys_unmapped", "score_func_mismatch",
                              "module_without_sharding_config"}, before["issues"]
    roundtrip = next(i for i in before["issues"] if i["code"] == "roundtrip_failed")
    assert "mlp.gate.e_score_correction_bias" in roundtrip["message"]
    assert before["results"]["probe"]["state_dict_roundtrip"] == "FAIL"

    probe = _left_the_probe_clean(_reprobe(store, run_id, target, *layouts.AFMOE))
    assert probe["roundtrip_detail"]["max_abs_diff"] == 0.0, probe["roundtrip_detail"]
    assert (probe["score_func"], probe["route_norm"]) == ("sigmoid", True)


def test_gpt_oss_interleaved_gate_up_and_router_bias_clear_while_its_core_findings_stay(tmp_path: Path) -> None:
    """Both findings are judged on the target: the gate weight its adapter makes from a small gate_up_proj in
    HF's layout, the router gate its own probe builds and the strict load. The run stays at the probe, for a
    person: gpt_oss's expert biases and clamped SwiGLU have no place in Titan's GroupedExperts (core)."""
    store = RunStore(tmp_path / "state")
    run_id, target = _start(store, "type:gpt_oss")
    before = store.read_state(run_id)
    assert {"gate_up_interleaved", "router_bias_dropped", "experts_transposed"} <= _codes(before), before["issues"]
    messages = {i["code"]: i["message"] for i in before["issues"]}
    assert "router gate without bias" in messages["router_bias_dropped"] and "'router.bias'" in messages[
        "router_bias_dropped"]
    assert "with the target's adapter, Titan's gate weight comes out" in messages["gate_up_interleaved"]

    # A person lets the run go on past the core findings (they stay recorded); the agent's fixes follow.
    engine.resume(run_id, {BLOCKER_KEY: "continue_anyway"}, store=store, advance_after=False)
    after = _reprobe(store, run_id, target, fixes.transposed_experts, layouts.gate_up_deinterleaved,
                     layouts.router_with_bias)
    probe = after["results"]["probe"]
    # The expert biases fail the strict load with no place in Titan's experts: the core finding's, no key to map.
    assert _codes(after) == {"expert_bias_unsupported", "expert_activation_unsupported",
                             "state_missing_from_sharding_config", "moe_output_contract"}, after["issues"]
    assert probe["target_probe"]["router_bias"] is True and probe["state_dict_roundtrip"] == "PASS"
    strict = probe["strict_load_detail"]
    assert (strict["missing"], strict["shape_mismatch"]) == ([], [])
    assert strict["unexpected"] == ["experts.down_proj_bias", "experts.gate_up_proj_bias"], strict
    assert (after["phase"], after["awaiting"]) == ("probe", "agent"), after["summary"]


def test_jetmoe_experts_outside_an_experts_module_are_read_and_converted(tmp_path: Path) -> None:
    """Both findings are judged on the target: its probe builds no Titan MoE from the block (it reads
    block.experts), then, fixed, its strict load carries the stacked weights and the router. What stays is a
    person's: the block's output bias has no place in Titan's MoE (core), and its mixture-of-attention layer."""
    store = RunStore(tmp_path / "state")
    run_id, target = _start(store, "type:jetmoe")
    before = store.read_state(run_id)
    assert _codes(before) == {"experts_outside_experts_module", "moe_probe_failed", "moe_output_bias_unsupported",
                              "attention_projection_unhandled"}, before["issues"]
    messages = {i["code"]: i["message"] for i in before["issues"]}
    assert "no attribute 'experts'" in messages["moe_probe_failed"]
    assert "builds no Titan MoE from it" in messages["experts_outside_experts_module"]

    engine.resume(run_id, {BLOCKER_KEY: "continue_anyway"}, store=store, advance_after=False)
    after = _reprobe(store, run_id, target, layouts.jetmoe_experts)
    # The routing comparison reads HF's per-token experts and weights; JetMoe's router hands its experts sorted
    # index lists instead, so the comparison cannot be made: a person's finding (it was silent before issue 37).
    assert _codes(after) == {"moe_output_bias_unsupported", "attention_projection_unhandled",
                             "routing_check_not_run"}, after["issues"]
    probe = after["results"]["probe"]
    assert (probe["num_experts"], probe["top_k"], probe["target_probe"]["moe_intermediate_size"]) == (8, 2, 5632)
    assert probe["state_dict_roundtrip"] == "PASS" and probe["roundtrip_detail"]["max_abs_diff"] == 0.0
    strict = probe["strict_load_detail"]
    assert (strict["missing"], strict["unexpected"], strict["shape_mismatch"]) == ([], ["bias"], []), strict
    assert "no such parameter" in next(i["message"] for i in after["issues"]
                                       if i["code"] == "moe_output_bias_unsupported")
    assert (after["phase"], after["awaiting"]) == ("probe", "agent"), after["summary"]
