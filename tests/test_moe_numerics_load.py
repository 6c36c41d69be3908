"""Numerics loads what the adapter converts, as the probe's strict load does; a key it drops is a finding.

Blind trial (issue 21): after the agent's adapter fix for afmoe the probe said "strict load PASS", and
numerics closed "All models passed" over a note "load_state_dict unexpected keys ['expert_bias']": the
router's correction bias never reached Titan. Two differences of our worker from the probe caused it: it
fed the adapter keys under ``mlp.`` instead of the model's own ``model.layers.N.mlp.`` (a pattern anchored
on the layer path did not match), and it built Titan's MoE without a load-balance coefficient, hence
without ``expert_bias_E``, whenever HF's bias was not named ``e_score_correction_bias`` (afmoe's is the
block's ``expert_bias``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from phases.add_moe_model import numerics as phase
from phases.add_moe_model.compat import ProbeRequest
from phases.add_moe_model.model_source import resolve_model_source
from phases.add_moe_model.records import Probe
from phases.add_moe_model.work.numerics import CompareResult, LoadReport, RoundTrip
from phases.add_moe_model.workspace import EXP, new_run_workspace
from tests.conftest import call_worker

AFMOE = dict(model_type="afmoe", hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
             num_hidden_layers=2, num_dense_layers=1, num_attention_heads=4, num_key_value_heads=4, head_dim=64,
             num_experts=8, num_experts_per_tok=2, num_shared_experts=1, vocab_size=256, max_position_embeddings=64,
             attn_implementation="sdpa", use_cache=False)
PROBE_PASS = Probe(model_type="qwen3_moe", strict_load="PASS",
                   strict_load_detail={"verdict": "PASS", "missing": [], "unexpected": []})


def fix_afmoe_adapter(target: Path) -> None:
    """The agent's fix: afmoe's router gate and block-level bias, patterns anchored on the layer path."""
    path = target / EXP / "state_dict_adapter.py"
    old = '        (r"^(.*\\.)gate\\.weight$", r"\\1router.gate.weight", False),\n'
    new = ('        (r"^(.*\\.layers\\.\\d+\\.mlp\\.)expert_bias$", r"\\1expert_bias_E", False),\n'
           '        (r"^(.*\\.)(?<!router\\.)gate\\.weight$", r"\\1router.gate.weight", False),\n')
    text = path.read_text()
    assert text.count(old) == 1, "the adapter's router pattern changed upstream"
    path.write_text(text.replace(old, new))


@pytest.mark.slow
def test_afmoe_bias_that_the_probes_strict_load_takes_loads_in_numerics_too(tmp_path: Path) -> None:
    target = new_run_workspace(tmp_path / "state")
    fix_afmoe_adapter(target)
    request = ProbeRequest(source=resolve_model_source("type:afmoe")).model_dump(mode="json")
    probe = call_worker("phases.add_moe_model.work.probe:probe", request, target=target)["report"]
    assert probe["strict_load"] == "PASS", probe["strict_load_detail"]
    out = call_worker("phases.add_moe_model.work.numerics:compare_dtypes",
                      {"model_type": "afmoe", "config_kwargs": AFMOE, "dtypes": ["float32"], "device": "cpu"},
                      target=target)
    (row,) = out["results"]
    assert row["load"] == {"missing": [], "unexpected": [], "ours": []}, row["load"]


def _verdict(**load: Any) -> CompareResult:
    return CompareResult(model_type="afmoe", dtype="bfloat16", device="cpu", status="PASS", seed=42, kl=2e-7,
                         cos_sim=0.99999, max_diff=3e-3, mean_diff=1e-4, roundtrip=RoundTrip(status="PASS"),
                         load=LoadReport(**load))


def test_a_key_our_worker_left_out_ends_the_phase_as_ours_not_the_agents() -> None:
    decided = phase.decide([_verdict(unexpected=["expert_bias_E"], ours=["expert_bias_E"])], probe=PROBE_PASS)
    assert decided.outcome == "failed", decided
    (issue,) = decided.issues
    assert issue.code == "numerics_worker_dropped_keys" and "['expert_bias_E']" in issue.message
    assert "strict load PASS" in issue.message and "not the experiment folder" in issue.message
    assert issue.fix_location.startswith("phases/add_moe_model/work/moe_blocks.py")
    assert "EXP" not in issue.fix_location and "state_dict_adapter" not in issue.fix_location


def test_a_key_the_adapter_misnames_is_the_agents_with_the_probes_verdict_beside_it() -> None:
    decided = phase.decide([_verdict(unexpected=["expert_bias"], missing=["expert_bias_E"])], probe=PROBE_PASS)
    assert (decided.outcome, decided.route) == ("needs_agent", "pass"), decided
    (issue,) = decided.issues
    assert issue.code == "adapter_keys_dropped" and issue.fix_location.startswith("state_dict_adapter.py")
    assert "['expert_bias']" in issue.message and "['expert_bias_E']" in issue.message
    assert "probe's strict load PASSed" in issue.message, issue.message
    assert "All models passed" not in phase.verdict_line([_verdict(unexpected=["expert_bias"])])


def test_a_key_titan_has_no_place_for_follows_the_probes_core_finding_to_a_person() -> None:
    probe = Probe.model_validate({
        "model_type": "gemma4_text", "strict_load": "FAIL",
        "strict_load_detail": {"verdict": "FAIL", "unexpected": ["down_proj.weight"]},
        "issues": [{"code": "router_scale_ignored", "severity": "core",
                    "message": "Gemma4TextRouter scales routing with ['scale', 'per_expert_scale']; ...",
                    "fix_location": "torchtitan/models/common/moe.py (TokenChoiceTopKRouter)"}]})
    row = _verdict(unexpected=["router.per_expert_scale", "router.scale"]).model_copy(
        update={"status": "FAIL", "kl": 4e-3})
    decided = phase.decide([row], probe=probe)
    assert decided.outcome == "needs_human", decided
    (issue,) = decided.issues
    assert issue.code == "titan_lacks_converted_keys" and "router_scale_ignored" in issue.message
    assert "torchtitan/models/common/moe.py" in issue.fix_location and "--waive" in issue.fix_location
    assert decided.route == "gap", "a waiver must still send a FAIL to the mandatory gap analysis"
