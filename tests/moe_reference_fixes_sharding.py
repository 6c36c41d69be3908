"""Reference fixes for the sharding findings, inside the experiment folder only (as an agent may write them).

Same rules as tests/moe_reference_fixes.py: each replacement must match exactly once in torchtitan
0.3.0's experiment folder, so a changed upstream text fails loudly instead of fixing nothing. The
fixes for per-head query/key layernorms (module_without_sharding_config) and attention sinks
(state_missing_from_sharding_config) live there; this module holds the one for a decoder layer whose
sequence mixer is not at ``self_attn`` (attention_projection_unhandled).
"""

from __future__ import annotations

from pathlib import Path

from tests.moe_reference_fixes import EXP, replace_once

SHARDING = f"{EXP}/hf_sharding.py"
PARALLELIZE = f"{EXP}/parallelize.py"

LAYER_MIXERS = '''    # A decoder layer mixes the sequence with softmax attention at ``self_attn`` or with linear
    # attention at ``linear_attn`` (Qwen3-Next / Qwen3.5 gated delta-net layers). Each has its own
    # configs; the dense MLP and the layer's own state are the same for both.
    if getattr(layer, "linear_attn", None) is not None:
        _set_linear_attention_configs(layer.linear_attn, enable_sp=enable_sp)
    if getattr(layer, "self_attn", None) is not None:
        _set_attention_configs(layer.self_attn, enable_sp=enable_sp)
    _set_mlp_and_layer_state_configs(layer, enable_sp=enable_sp)


def _set_attention_configs(attn: nn.Module, *, enable_sp: bool) -> None:
    """Softmax attention: its input boundary, the flex kernel, projections and per-head norms."""
'''

MLP_AND_LAYER_STATE = '''

def _set_mlp_and_layer_state_configs(layer: nn.Module, *, enable_sp: bool) -> None:
    """The dense MLP (non-MoE layers only) and any state held directly on the decoder layer."""
'''

LINEAR_ATTENTION = '''

def _set_linear_attention_configs(mixer: nn.Module, *, enable_sp: bool) -> None:
    """Linear attention (e.g. a gated delta net) runs replicated across TP ranks.

    It is not head-sharded: its depthwise ``conv1d`` holds channels laid out as [all q heads | all
    k heads | all v heads] while its input projections are grouped per key head, so no dim-0 shard
    gives a rank the channels of the heads its projection shard produces. Instead its input is
    gathered to Replicate at the boundary (as softmax attention's is), every weight and buffer is
    replicated, and its output, the same on every TP rank, is sliced back into the SP layout, which
    needs no collective. Without TP every placement here resolves to no mesh (FSDP/EP only).
    """
    for sub in mixer.modules():
        sub._sharding_config = _replicate_config(sub)
    arg = _first_forward_arg(mixer)
    mixer._sharding_config = ShardingConfig(
        state_shardings=_replicate_config(mixer).state_shardings,
        in_src_shardings={arg: _sp_activation(enable_sp=enable_sp)},
        in_dst_shardings={arg: dense_activation_placement(tp=spmd.R)},
        out_src_shardings=dense_activation_placement(tp=spmd.R),
        out_dst_shardings=_sp_activation(enable_sp=enable_sp),
    )
'''

NO_CP_FOR_LINEAR_ATTENTION = '''\
    # 3a. Linear attention (hf_sharding.py) runs a recurrence over the tokens it is given, in
    # order; a CP rank holds only a load-balanced chunk of the sequence, so its state would be
    # wrong. Refuse CP for such models instead.
    if parallel_dims.cp_enabled and any(
        getattr(block, "linear_attn", None) is not None for block in model.layers
    ):
        raise NotImplementedError(
            "Context parallelism is not supported for models with linear-attention layers "
            "(linear_attn): their recurrence needs the whole sequence, in order, on one rank."
        )

'''
CP_WRAP = "    # 3b. Under CP, wrap each flex kernel forward"


def linear_attention_layers(target: Path) -> None:
    """attention_projection_unhandled (Qwen3-Next, Qwen3.5, LARA: the layer's mixer is ``linear_attn``).

    ``_set_layer_sharding_configs`` read ``layer.self_attn`` unconditionally; it now configures the
    mixer the layer has: softmax attention as before (its block becomes ``_set_attention_configs``,
    unchanged), linear attention replicated (see ``_set_linear_attention_configs``), then the dense MLP
    and layer state for either (``_set_mlp_and_layer_state_configs``, unchanged). CP, which would hand
    the recurrence a reordered chunk of the sequence, is refused in parallelize.py.
    """
    replace_once(target, SHARDING, "    attn = layer.self_attn\n", LAYER_MIXERS)
    replace_once(target, SHARDING, "\n    # --- Dense MLP (non-MoE layers only) ---\n",
                 MLP_AND_LAYER_STATE + "    # --- Dense MLP (non-MoE layers only) ---\n")
    replace_once(target, SHARDING, "\n\ndef _hf_norm_config(", LINEAR_ATTENTION + "\n\ndef _hf_norm_config(")
    replace_once(target, PARALLELIZE, CP_WRAP, NO_CP_FOR_LINEAR_ATTENTION + CP_WRAP)
