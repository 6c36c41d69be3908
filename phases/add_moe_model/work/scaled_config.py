"""Scaled-down HF config kwargs that keep a real model's MoE structure (worker side).

One builder serves two uses: Phase 2's synthetic ``_MODEL_CONFIGS`` entry (real hidden and
intermediate sizes, 8 experts, top-2, minimum layers, the skill's small MLA/DSA dims) and
the probe's tiny materialized model (every size shrunk) used to compare round-trip values.
Keys are written under the names the config class's ``__init__`` reads, so
``AutoConfig.for_model(**entry)`` takes them as they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from phases.add_moe_model.work.config_fields import (
    EXPERT_COUNT_KEYS, TOP_K_KEYS, config_init_keys, expert_count, init_key, layer_count_key, read_field,
    read_first_layer_field, resolve_config_key,
)

MLA_DIMS = {"kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16}
DSA_DIMS = {"index_n_heads": 2, "index_head_dim": 8, "index_topk": 8}
# Fields copied from the real config when the config class reads them.
CARRIED_KEYS = (
    "n_shared_experts", "norm_topk_prob", "routed_scaling_factor", "scoring_func", "topk_method",
    "shared_expert_intermediate_size", "intermediate_size_mlp", "partial_rotary_factor",
    "attention_bias", "use_qk_norm", "hidden_act", "head_dim", "hidden_size_per_layer_input",
    "sliding_window",
)
TINY = {
    "hidden_size": 64, "intermediate_size": 64, "moe_intermediate_size": 32, "head_dim": 16,
    "shared_expert_intermediate_size": 64, "intermediate_size_mlp": 64,
    "hidden_size_per_layer_input": 16,
}


@dataclass(frozen=True, kw_only=True, slots=True)
class ScalePlan:
    """How far to scale a real config down, and which of its layers to keep.

    Attributes:
        num_layers: decoder layers to keep when ``layers`` is empty, every one MoE, e.g. 1.
        layers: real layer indices the scaled layers copy, in order, e.g. (0, 2, 5): the first layer of each
            kind (work/layer_kinds.py). Their per-layer config values (layer_types, ...) come along.
        dense: positions among ``layers`` whose real layer has no MoE, e.g. (0,).
        prefix: ``layers`` are the real model's first layers and the config's own layer mechanism
            (first_k_dense_replace, expert_layer_period, ...) is kept instead of rewritten.
        experts: routed experts, e.g. 8.
        top_k: experts per token, e.g. 2.
        tiny: shrink every size too (probe values), not only the counts (synthetic entry).
    """

    num_layers: int = 1
    layers: tuple[int, ...] = ()
    dense: tuple[int, ...] = ()
    prefix: bool = False
    experts: int = 8
    top_k: int = 2
    tiny: bool = False

    @property
    def positions(self) -> tuple[int, ...]:
        """The real index each scaled layer copies."""
        return self.layers or tuple(range(self.num_layers))


def build_scaled_kwargs(real: Any, plan: ScalePlan) -> dict[str, Any]:
    """Return ``AutoConfig.for_model`` kwargs for a scaled copy of ``real``."""
    keys = config_init_keys(real.model_type)
    entry: dict[str, Any] = {"model_type": real.model_type}
    entry.update(_size_fields(real, keys, plan))
    entry.update(_routing_fields(real, keys, plan))
    entry.update(_attention_fields(real, keys, plan))
    entry.update(_layer_fields(real, keys, plan))
    entry.update(vocab_size=256, max_position_embeddings=64, attn_implementation="sdpa", use_cache=False)
    if "vocab_size_per_layer_input" in keys:
        entry["vocab_size_per_layer_input"] = 256
    pad = read_field(real, "pad_token_id")
    if "pad_token_id" in keys and isinstance(pad, int) and pad >= 256:
        entry["pad_token_id"] = 255  # the shrunk vocab must still hold the padding index
    return entry


def _size_fields(real: Any, keys: frozenset[str], plan: ScalePlan) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("hidden_size", "intermediate_size", "moe_intermediate_size", *CARRIED_KEYS):
        value, name = read_field(real, key), init_key(real, key, keys)
        if name is not None and value is not None and not (key == "head_dim" and _is_mla(real)):
            out[name] = TINY[key] if plan.tiny and key in TINY else value
    return out


def _routing_fields(real: Any, keys: frozenset[str], plan: ScalePlan) -> dict[str, Any]:
    out: dict[str, Any] = {}
    expert_key = resolve_config_key(keys, EXPERT_COUNT_KEYS)
    top_k_key = resolve_config_key(keys, TOP_K_KEYS)
    if expert_key:
        out[expert_key] = plan.experts
    if top_k_key:
        out[top_k_key] = plan.top_k
    zero_experts, real_experts = read_field(real, "zero_expert_num"), expert_count(real)
    if "zero_expert_num" in keys and zero_experts and real_experts:
        # experts that compute nothing (LongCat-Flash) keep their share of the router's choices
        out["zero_expert_num"] = max(1, round(plan.experts * int(zero_experts) / real_experts))
    n_group = read_field(real, "n_group")
    if "n_group" in keys and n_group:
        group = resolve_expert_groups(plan.experts, wanted=int(n_group))
        out["n_group"] = group
        out["topk_group"] = min(int(read_field(real, "topk_group") or 1), group)
    return out


def resolve_expert_groups(experts: int, *, wanted: int) -> int:
    """Largest group count <= wanted that divides ``experts`` with >= 2 experts per group."""
    return max(g for g in range(1, max(wanted, 1) + 1) if experts % g == 0 and experts // g >= 2)


def _attention_fields(real: Any, keys: frozenset[str], plan: ScalePlan) -> dict[str, Any]:
    out: dict[str, Any] = {}
    hidden = TINY["hidden_size"] if plan.tiny else int(real.hidden_size)
    heads, kv = resolve_heads(real, hidden=hidden, tiny=plan.tiny)
    out["num_attention_heads"] = heads
    if "num_key_value_heads" in keys:
        out["num_key_value_heads"] = kv
    if _is_mla(real):
        out.update({k: v for k, v in MLA_DIMS.items() if k in keys})
        if "q_lora_rank" in keys:
            out["q_lora_rank"] = None if read_field(real, "q_lora_rank") is None else 16
    if read_field(real, "index_topk") is not None:
        out.update({k: v for k, v in DSA_DIMS.items() if k in keys})
    return out


def resolve_heads(real: Any, *, hidden: int, tiny: bool) -> tuple[int, int]:
    """Pick (heads, kv_heads): heads divide ``hidden``, kv heads divide heads."""
    real_heads = int(read_first_layer_field(real, "num_attention_heads"))
    real_kv = int(read_first_layer_field(real, "num_key_value_heads") or real_heads)
    if tiny:
        return 4, 4 if real_kv == real_heads else 2
    heads = max(h for h in range(1, real_heads + 1) if hidden % h == 0)
    kv = real_kv if heads % real_kv == 0 else math.gcd(heads, real_kv)
    return heads, kv


# Config fields that place layer kinds; a prefix plan carries the real values.
LAYER_MECHANISM_KEYS = (
    "first_k_dense_replace", "decoder_sparse_step", "mlp_only_layers", "interleave_moe_layer_step",
    "enable_moe_block", "expert_layer_period", "expert_layer_offset", "attn_layer_period", "attn_layer_offset",
    "layer_group_size", "full_attention_interval", "sliding_window_pattern", "no_rope_layer_interval",
)


def _layer_fields(real: Any, keys: frozenset[str], plan: ScalePlan) -> dict[str, Any]:
    positions = plan.positions
    out: dict[str, Any] = {layer_count_key(keys): len(positions)}
    if plan.prefix:
        kept = {k: read_field(real, k) for k in LAYER_MECHANISM_KEYS if k in keys}
        out.update({k: v for k, v in kept.items() if v is not None})
    else:
        out.update(_moe_placement(real, keys, plan))
    if "moe_layers" in keys and read_field(real, "moe_layers") is not None:
        out["moe_layers"] = ([i for i in real.moe_layers if i < len(positions)] if plan.prefix
                             else [j for j in range(len(positions)) if j not in plan.dense])
    out.update(per_layer_lists(real, keys, positions, taken=out))
    return out


def _moe_placement(real: Any, keys: frozenset[str], plan: ScalePlan) -> dict[str, Any]:
    """The config's MoE mechanism rewritten so that exactly the positions outside ``plan.dense`` are MoE."""
    out: dict[str, Any] = {}
    leading = next((j for j in range(len(plan.positions)) if j not in plan.dense), len(plan.positions))
    if "first_k_dense_replace" in keys and read_field(real, "first_k_dense_replace") is not None:
        out["first_k_dense_replace"] = leading
    if "decoder_sparse_step" in keys and read_field(real, "decoder_sparse_step") is not None:
        out["decoder_sparse_step"] = 1
    if "mlp_only_layers" in keys:
        out["mlp_only_layers"] = list(plan.dense)
    if "mlp_layer_types" in keys and read_field(real, "mlp_layer_types") is not None:
        out["mlp_layer_types"] = ([real.mlp_layer_types[i] for i in plan.layers] if plan.layers
                                  else ["sparse"] * len(plan.positions))
    if "interleave_moe_layer_step" in keys:
        out["interleave_moe_layer_step"] = 1
    if "enable_moe_block" in keys:
        out["enable_moe_block"] = True
    return out


def per_layer_lists(real: Any, keys: frozenset[str], positions: tuple[int, ...], *,
                    taken: dict[str, Any]) -> dict[str, Any]:
    """Every other per-layer list the class reads (layer_types, ...), at the real layers ``positions`` copy:
    a config that validates its lists against num_hidden_layers must get lists of that length."""
    total = read_field(real, "num_hidden_layers")
    out = {}
    for key in sorted(keys - set(taken)):
        value = read_field(real, key)
        if isinstance(value, (list, tuple)) and value and len(value) == total:
            out[key] = [value[i % len(value)] for i in positions]
    return out


def _is_mla(config: Any) -> bool:
    return read_field(config, "kv_lora_rank") is not None
