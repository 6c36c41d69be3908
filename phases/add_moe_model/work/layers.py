"""Which decoder layers of an HF config are MoE, by the config's own mechanism.

The probe builds every layer on meta and reads the MoE layers from the built ones
(work/layer_kinds.py); the mechanism (first_k_dense_replace, decoder_sparse_step,
mlp_layer_types, ...) is its cross-check, and a note says where the two disagree.
"""

from __future__ import annotations

from typing import Any

from phases.add_moe_model.work.config_fields import read_field

MECHANISMS = (
    "mlp_layer_types",
    "first_k_dense_replace",
    "decoder_sparse_step",
    "moe_layers",
    "enable_moe_block",
    "all_layers",
)


def resolve_moe_mechanism(config: Any) -> str:
    """Name the config field that decides which layers are MoE."""
    if read_field(config, "mlp_layer_types") is not None:
        return "mlp_layer_types"
    if read_field(config, "first_k_dense_replace") is not None:
        return "first_k_dense_replace"
    if read_field(config, "decoder_sparse_step") is not None:
        return "decoder_sparse_step"
    if read_field(config, "moe_layers") is not None or hasattr(config, "interleave_moe_layer_step"):
        return "moe_layers"
    if hasattr(config, "enable_moe_block"):
        return "enable_moe_block"
    if read_field(config, "expert_layer_period") is not None:
        return "expert_layer_period"
    return "all_layers"


def predict_moe_layers(config: Any) -> list[int]:
    """Return the MoE layer indices the config's mechanism implies."""
    n = int(config.num_hidden_layers)
    mechanism = resolve_moe_mechanism(config)
    if mechanism == "mlp_layer_types":
        return [i for i, t in enumerate(config.mlp_layer_types[:n]) if t == "sparse"]
    if mechanism == "first_k_dense_replace":
        return list(range(int(config.first_k_dense_replace), n))
    if mechanism == "decoder_sparse_step":
        step = int(config.decoder_sparse_step)
        dense = set(read_field(config, "mlp_only_layers") or ())
        return [i for i in range(n) if i not in dense and step > 0 and (i + 1) % step == 0]
    if mechanism == "moe_layers":
        if read_field(config, "moe_layers") is not None:
            return [i for i in config.moe_layers if i < n]
        step = int(config.interleave_moe_layer_step)
        return [i for i in range(n) if (i + 1) % step == 0]
    if mechanism == "enable_moe_block":
        return list(range(n)) if config.enable_moe_block else []
    if mechanism == "expert_layer_period":  # jamba: experts where i % period == offset
        period, offset = int(config.expert_layer_period), int(read_field(config, "expert_layer_offset") or 0)
        return [i for i in range(n) if period > 0 and i % period == offset]
    return list(range(n))
