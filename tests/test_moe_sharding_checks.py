"""The sharding checks' own claims, shown against torchtitan's Module protocol (no run, no target copy)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def _layer_with_undeclared_sinks() -> torch.nn.Module:
    """A decoder layer whose attention has a config (as the target gives self_attn) that leaves its sinks out."""
    from torchtitan.experiments.transformers_modeling_backend.module_conversion import convert_hf_to_module
    from torchtitan.protocols.sharding import ShardingConfig

    layer, attn = torch.nn.Module(), torch.nn.Module()
    attn.q_proj = torch.nn.Linear(8, 8, bias=False)
    attn.sinks = torch.nn.Parameter(torch.zeros(2))
    layer.self_attn = attn
    convert_hf_to_module(layer)
    attn._sharding_config = ShardingConfig()
    return layer


def test_undeclared_own_state_is_reported_as_failing_parallelize_with_or_without_tp() -> None:
    """The finding used to say the state stays a plain tensor under TP; parallelize refuses it, TP or not."""
    from phases.add_moe_model.work.sharding_checks import check_uncovered_state

    layer = _layer_with_undeclared_sinks()
    (issue,) = check_uncovered_state(layer, index=1, skip=())
    assert (issue.code, issue.severity) == ("state_missing_from_sharding_config", "fixable")
    assert "['layers.1.self_attn.sinks']" in issue.message
    assert "model.parallelize raises" in issue.message and "without (FSDP/EP only)" in issue.message
    assert "plain tensors next to DTensors" not in issue.message
    # The claim itself: _distribute_states looks the name up before it resolves any mesh, so it raises
    # with no parallel dims at all (an FSDP-only run meets the same error as a TP one).
    with pytest.raises(ValueError, match=r"\.sinks has no placement declared in sharding_config\.state_shardings"):
        layer.self_attn._distribute_states(None)
