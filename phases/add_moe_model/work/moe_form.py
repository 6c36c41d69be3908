"""Where a config keeps its experts, and the MoE form of a config class's defaults (worker side).

Some config classes default to a dense model although every published checkpoint is MoE
(gemma4_text: ``enable_moe_block=False``; doge: ``is_moe=False``; dots1: ``n_routed_experts=None``), and some keep
the expert count in a sub-config (dbrx: ``ffn_config.moe_num_experts``). ``type:<model_type>``
means the class's defaults in their MoE form: the switches the class's ``__init__`` reads are
turned on (8 experts, top-2, the MoE block enabled, with the expert sizes the block multiplies
with) only where the defaults leave them off, and an unset ``head_dim`` is hidden/heads.
"""

from __future__ import annotations

from typing import Any

from phases.add_moe_model.work.config_fields import (
    EXPERT_COUNT_KEYS, TOP_K_KEYS, config_init_keys, expert_count, read_field,
)


MOE_SWITCHES = ("enable_moe_block", "is_moe")
"""Boolean config fields whose False default leaves a class's MoE block out."""


def moe_form_kwargs(model_type: str) -> dict[str, Any]:
    """kwargs that turn the defaults of ``model_type`` into an MoE model ({} when they already are)."""
    from transformers import AutoConfig

    defaults = AutoConfig.for_model(model_type)
    keys = config_init_keys(model_type)
    switches: dict[str, Any] = {}
    switches.update({k: True for k in MOE_SWITCHES if k in keys and read_field(defaults, k) is False})
    if expert_count(defaults) is None:
        switches.update({k: 8 for k in EXPERT_COUNT_KEYS if k in keys and read_field(defaults, k) is None})
        switches.update({k: 2 for k in TOP_K_KEYS if k in keys and read_field(defaults, k) is None})
    if switches:
        switches.update(_moe_sizes(defaults, keys))
    if "head_dim" in keys and read_field(defaults, "head_dim") is None and read_field(defaults, "num_attention_heads"):
        switches["head_dim"] = int(defaults.hidden_size) // int(defaults.num_attention_heads)
    return switches


def _moe_sizes(defaults: Any, keys: frozenset[str]) -> dict[str, Any]:
    """Sizes a dense default leaves unset that the MoE block multiplies with."""
    out: dict[str, Any] = {}
    if "moe_intermediate_size" in keys and read_field(defaults, "moe_intermediate_size") is None:
        out["moe_intermediate_size"] = int(defaults.intermediate_size)
    if "n_shared_experts" in keys and read_field(defaults, "n_shared_experts") is None:
        out["n_shared_experts"] = 1
    return out
