"""Reference fixes for findings about where a block keeps its weights and how the adapter converts them.

Same rules as tests/moe_reference_fixes.py: edits of torchtitan 0.3.0's experiment folder only, each
replacement matching exactly once, so a changed upstream text fails loudly instead of fixing nothing.
AfMoE (its router already at ``router.gate``, its correction bias on the block) is taken whole, so its
run leaves the probe; gpt_oss's interleaved gate/up columns and router bias are cleared one by one (its
expert biases and clamped SwiGLU stay: they are core findings, a person's call).
"""

from __future__ import annotations

from pathlib import Path

from tests.moe_reference_fixes import ADAPTER, MOE, replace_once
from tests.moe_reference_fixes_sharding import SHARDING

HF_TO_TITAN_LOOP = "    titan_state_dict = {}\n\n    for key, value in hf_state_dict.items():\n"

AFMOE_KEYS = '''        # AfMoE: the router's linear already sits at Titan's ``router.gate``, and the correction bias
        # is a parameter of the block, ``expert_bias``, Titan's ``expert_bias_E``. Both keep their
        # HF key for the way back (the reverse pattern would send expert_bias to gate.*).
        if key.endswith((".router.gate.weight", ".mlp.expert_bias")):
            titan_key = key + "_E" if key.endswith(".expert_bias") else key
            titan_state_dict[titan_key] = value
            _TITAN_TO_ORIGINAL_HF_KEY[titan_key] = key
            continue

'''

AFMOE_ROUTER = '''    if type(gate).__name__ == "AfmoeTokenChoiceRouter":
        # AfMoE routes with sigmoid + the block's expert_bias, renormalises the top-k, then scales.
        score_func = "sigmoid"
'''


def afmoe_keys(target: Path) -> None:
    """roundtrip_failed and state_dict_keys_unmapped (AfMoE): ``mlp.router.gate.weight`` was renamed to
    ``router.router.gate.weight`` and ``mlp.expert_bias`` passed through, then came back as
    ``gate.e_score_correction_bias``; both now map to Titan's names and back to their own."""
    replace_once(target, ADAPTER, HF_TO_TITAN_LOOP, HF_TO_TITAN_LOOP + AFMOE_KEYS)


def afmoe_router(target: Path) -> None:
    """score_func_mismatch (AfMoE): sigmoid scores, always renormalised top-k, ``route_scale`` on the router."""
    replace_once(target, MOE, "    score_func = _resolve_score_func(gate, config)\n\n    # Route normalization",
                 "    score_func = _resolve_score_func(gate, config)\n" + AFMOE_ROUTER
                 + "\n    # Route normalization")
    replace_once(target, MOE, "    elif hasattr(gate, \"norm_topk_prob\"):\n        route_norm = gate.norm_topk_prob\n",
                 "    elif hasattr(gate, \"norm_topk_prob\"):\n        route_norm = gate.norm_topk_prob\n"
                 "    elif type(gate).__name__ == \"AfmoeTokenChoiceRouter\":\n        route_norm = True\n")
    replace_once(target, MOE, '    route_scale = getattr(config, "routed_scaling_factor", 1.0)\n\n'
                 "    # Group-limited routing",
                 '    route_scale = getattr(config, "routed_scaling_factor", getattr(gate, "route_scale", 1.0))\n\n'
                 "    # Group-limited routing")


def afmoe_sharding(target: Path) -> None:
    """module_without_sharding_config (AfMoE): the norms around the MoE (``pre_mlp_layernorm``,
    ``post_mlp_layernorm``) take the residual-stream norm config; the attention's output gate
    ``gate_proj`` (hidden -> heads * head_dim, multiplied into the heads' output) is split by heads as q_proj."""
    replace_once(target, SHARDING, '    if hasattr(layer, "post_feedforward_layernorm"):\n',
                 '    for norm_name in ("pre_mlp_layernorm", "post_mlp_layernorm"):\n'
                 "        if hasattr(layer, norm_name):\n"
                 "            getattr(layer, norm_name)._sharding_config = _hf_norm_config(enable_sp=enable_sp)\n"
                 '    if hasattr(layer, "post_feedforward_layernorm"):\n')
    replace_once(target, SHARDING, "    # Q/K norms (Qwen3)",
                 '    if isinstance(getattr(attn, "gate_proj", None), nn.Linear):\n'
                 "        attn.gate_proj._sharding_config = colwise_config()\n\n"
                 "    # Q/K norms (Qwen3)")


AFMOE = (afmoe_keys, afmoe_router, afmoe_sharding)
