"""Kernel alignment maps Titan's expert weights into the HF experts' own layout, gated or not."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from phases.add_moe_model.work.kernel_align import expert_weights_as_hf

NAMES = ("w1", "w2", "w3")  # the target adapter's (gate, down, up) names in torchtitan 0.3.0


def _titan_experts(*names: str, experts: int = 4, dim: int = 8, inter: int = 6) -> nn.Module:
    shapes = {"w1": (experts, inter, dim), "w2": (experts, dim, inter), "w3": (experts, inter, dim)}
    inner = nn.Module()
    for name in names:
        setattr(inner, name, nn.Parameter(torch.randn(shapes[name])))
    return inner


def _hf_experts(model_type: str, **dims: int) -> nn.Module:
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **dims)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return next(m for n, m in model.named_modules() if n.endswith("experts") and hasattr(m, "down_proj"))


def test_non_gated_experts_take_titans_one_input_projection() -> None:
    hf = _hf_experts("nemotron_h", hidden_size=8, moe_intermediate_size=6, n_routed_experts=4, num_hidden_layers=2,
                     layers_block_type=["mamba", "moe"], num_attention_heads=2, num_key_value_heads=1,
                     mamba_num_heads=2, mamba_head_dim=4, ssm_state_size=4, n_groups=1, vocab_size=32)
    assert not hasattr(hf, "gate_up_proj") and hf.up_proj.shape == (4, 6, 8)
    inner = _titan_experts("w1", "w2")
    weights = expert_weights_as_hf(inner, hf, names=NAMES)
    assert set(weights) == {"up_proj", "down_proj"} and weights["up_proj"] is inner.w1
    assert tuple(weights["up_proj"].shape) == tuple(hf.up_proj.shape)
    assert tuple(weights["down_proj"].shape) == tuple(hf.down_proj.shape)
    with pytest.raises(ValueError, match="not gated .* non-gated expert class"):
        expert_weights_as_hf(_titan_experts("w1", "w2", "w3"), hf, names=NAMES)


def test_gated_experts_are_fused_as_hf_holds_them() -> None:
    hf = _hf_experts("qwen3_moe", hidden_size=8, moe_intermediate_size=6, num_experts=4, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1, vocab_size=32)
    weights = expert_weights_as_hf(_titan_experts("w1", "w2", "w3"), hf, names=NAMES)
    assert tuple(weights["gate_up_proj"].shape) == tuple(hf.gate_up_proj.shape)
    with pytest.raises(ValueError, match="gated .* lacks w3"):
        expert_weights_as_hf(_titan_experts("w1", "w2"), hf, names=NAMES)
