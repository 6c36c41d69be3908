"""A scale HF applies after its experts is part of the routing both checks compare (the blind trial's BEAM).

BEAM's router hands its experts the bare top-k weights and its block multiplies their output by
routed_scaling_factor (2.5); Titan's router multiplies the weights. The probe's routing check and the gap
analysis's stage trace both compared the weights alone: the probe told the agent to set route_scale=1 (which
would drop the factor), and the trace named "routing" (9.71e-01) and "block on HF's routing" (6.75e+00) as
divergences that the whole block does not have. Both now measure the factor and give it to HF's weights.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from phases.add_moe_model.workspace import new_run_workspace
from tests import moe_reference_fixes as fixes
from tests.conftest import call_worker

pytestmark = pytest.mark.slow
TRACE = "phases.add_moe_model.work.stage_trace:trace_stages"
BEAM = dict(model_type="beam", hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_experts=16,
            num_experts_per_tok=4, n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True,
            num_hidden_layers=1, layer_types=["full_attention"], mlp_layer_types=["sparse"], num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, vocab_size=256, max_position_embeddings=64,
            attn_implementation="sdpa", use_cache=False)


def stage(trace: dict, name: str) -> dict:
    return next(row for row in trace["stages"] if row["stage"] == name)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_trace_gives_hf_s_weights_the_factor_its_block_applies_after_the_experts(tmp_path: Path, dtype: str):
    target = new_run_workspace(tmp_path / "state")
    fixes.expert_bias_key_renamed(target)
    trace = call_worker(TRACE, {"model_type": "beam", "config_kwargs": BEAM, "dtype": dtype, "device": "cpu"},
                        target=target)
    assert trace["status"] == "traced", trace
    routing, block = stage(trace, "routing"), stage(trace, "block on HF's routing")
    assert "x2.5, the factor its block applies after its experts, measured" in routing["detail"], routing
    assert routing["tokens_routed_differently"] == 0
    assert routing["max_diff"] is not None and routing["max_diff"] < 5e-2, routing
    assert block["max_diff"] is not None and block["max_diff"] < 1e-2, block
