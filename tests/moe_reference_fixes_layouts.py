"""Reference fixes for findings about where a block keeps its weights and how the adapter converts them.

Same rules as tests/moe_reference_fixes.py: edits of torchtitan 0.3.0's experiment folder only, each
replacement matching exactly once, so a changed upstream text fails loudly instead of fixing nothing.
AfMoE (its router already at ``router.gate``, its correction bias on the block) is taken whole, so its
run leaves the probe; gpt_oss's interleaved gate/up columns and router bias are cleared (its expert
biases and clamped SwiGLU stay: core findings, a person's call, so its run stays at the probe).
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

HALVES = """            intermediate_size = value.shape[1] // 2
            titan_state_dict[f"{prefix}{_TITAN_EXPERTS_PREFIX}.{gate_name}"] = value[
                :, :intermediate_size, :
            ]
            titan_state_dict[f"{prefix}{_TITAN_EXPERTS_PREFIX}.{up_name}"] = value[
                :, intermediate_size:, :
            ]
"""
SPLIT = """            intermediate_size = value.shape[1] // 2
            gate_rows, up_rows = slice(None, intermediate_size), slice(intermediate_size, None)
            if f"{prefix}experts.gate_up_proj_bias" in hf_state_dict:
                # gpt-oss (the checkpoints with expert biases) interleaves the columns: gate ::2, up 1::2.
                gate_rows, up_rows = slice(0, None, 2), slice(1, None, 2)
                _INTERLEAVED_GATE_UP_PREFIXES.add(prefix)
            titan_state_dict[f"{prefix}{_TITAN_EXPERTS_PREFIX}.{gate_name}"] = value[:, gate_rows, :]
            titan_state_dict[f"{prefix}{_TITAN_EXPERTS_PREFIX}.{up_name}"] = value[:, up_rows, :]
"""
FUSE = """            fused_value = torch.cat(
                [titan_state_dict[g_key], titan_state_dict[u_key]], dim=1
            )
"""
REFUSE = """            gate, up = titan_state_dict[g_key], titan_state_dict[u_key]
            if prefix in _INTERLEAVED_GATE_UP_PREFIXES:
                fused_value = torch.stack([gate, up], dim=2).reshape(gate.shape[0], -1, gate.shape[2])
            else:
                fused_value = torch.cat([gate, up], dim=1)
"""


def gate_up_deinterleaved(target: Path) -> None:
    """gate_up_interleaved (gpt_oss): the gate is HF's columns ::2 and the up 1::2; split that way into Titan's
    gate and up weights, and interleaved again on the way back (the prefixes are remembered on the way in)."""
    replace_once(target, ADAPTER, "\n\ndef hf_to_titan_moe_state_dict(\n",
                 "\n\n# prefixes whose HF gate_up_proj interleaves gate and up columns\n"
                 "_INTERLEAVED_GATE_UP_PREFIXES: set[str] = set()\n\n\ndef hf_to_titan_moe_state_dict(\n")
    replace_once(target, ADAPTER, HALVES, SPLIT)
    replace_once(target, ADAPTER, FUSE, REFUSE)


def router_with_bias(target: Path) -> None:
    """router_bias_dropped (gpt_oss): the probe notes the router's bias, the Titan router gate is built with one,
    and HF's ``router.bias`` maps to ``router.gate.bias`` (and back)."""
    replace_once(target, MOE, '        "shared_expert_info": shared_expert_info,\n    }\n\n\ndef _resolve_num_experts(',
                 '        "shared_expert_info": shared_expert_info,\n'
                 '        "router_bias": isinstance(getattr(gate, "bias", None), torch.Tensor),\n'
                 '    }\n\n\ndef _resolve_num_experts(')
    replace_once(target, MOE, '        num_limited_groups=params["num_limited_groups"],\n    )\n',
                 '        num_limited_groups=params["num_limited_groups"],\n'
                 '        bias=params.get("router_bias", False),\n    )\n')
    replace_once(target, ADAPTER, '        (r"^(.*\\.)router\\.weight$", r"\\1router.gate.weight", False),\n',
                 '        (r"^(.*\\.)router\\.weight$", r"\\1router.gate.weight", False),\n'
                 '        (r"^(.*\\.)router\\.bias$", r"\\1router.gate.bias", False),\n')
    replace_once(target, ADAPTER, '        (r"^(.*\\.)router\\.gate\\.weight$", r"\\1gate.weight", False),\n',
                 '        (r"^(.*\\.)router\\.gate\\.weight$", r"\\1gate.weight", False),\n'
                 '        (r"^(.*\\.)router\\.gate\\.bias$", r"\\1router.bias", False),\n')


JETMOE_PROBE = '''    experts = getattr(moe_block, "experts", None)
    if experts is None and hasattr(moe_block, "input_linear"):
        # JetMoe: the stacked experts are input_linear (E, 2I, H: gate | up halves) and output_linear (E, H, I).
        experts = moe_block.input_linear
'''

JETMOE_LAYOUT = '''

# JetMoe keeps its stacked experts outside an ``experts`` module: input_linear is HF's usual gate_up_proj
# (E, 2I, H, gate | up halves) and output_linear its down_proj (E, H, I). They are renamed on the way in,
# and back for the prefixes seen on the way in.
_JETMOE_NAMES = {"input_linear.weight": "experts.gate_up_proj", "output_linear.weight": "experts.down_proj"}
_JETMOE_PREFIXES: set[str] = set()


def _from_jetmoe_layout(hf_state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    renamed = {}
    for key, value in hf_state_dict.items():
        for jet, hf in _JETMOE_NAMES.items():
            if key.endswith(f".mlp.{jet}"):
                prefix = key[: -len(jet)]
                _JETMOE_PREFIXES.add(prefix)
                key = prefix + hf
                break
        renamed[key] = value
    return renamed


def _to_jetmoe_layout(hf_state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    for prefix in _JETMOE_PREFIXES:
        for jet, hf in _JETMOE_NAMES.items():
            if prefix + hf in hf_state_dict:
                hf_state_dict[prefix + jet] = hf_state_dict.pop(prefix + hf)
    return hf_state_dict


def hf_to_titan_moe_state_dict(
'''


def jetmoe_experts(target: Path) -> None:
    """experts_outside_experts_module and moe_probe_failed (JetMoe): the probe reads the experts from
    ``input_linear``, the adapter renames JetMoe's stacked weights to HF's usual expert keys (and back), and
    its router linear ``router.layer`` maps to ``router.gate``. The block's output bias stays (core)."""
    replace_once(target, MOE, "    experts = moe_block.experts\n", JETMOE_PROBE)
    replace_once(target, ADAPTER, "\n\ndef hf_to_titan_moe_state_dict(\n", JETMOE_LAYOUT)
    replace_once(target, ADAPTER, "    titan_state_dict = {}\n\n    for key, value in hf_state_dict.items():\n",
                 "    titan_state_dict = {}\n    hf_state_dict = _from_jetmoe_layout(hf_state_dict)\n\n"
                 "    for key, value in hf_state_dict.items():\n")
    replace_once(target, ADAPTER, "            hf_state_dict[key] = value\n\n    return hf_state_dict\n",
                 "            hf_state_dict[key] = value\n\n    return _to_jetmoe_layout(hf_state_dict)\n")
    replace_once(target, ADAPTER, '        (r"^(.*\\.)router\\.proj\\.weight$", r"\\1router.gate.weight", False),\n',
                 '        (r"^(.*\\.)router\\.proj\\.weight$", r"\\1router.gate.weight", False),\n'
                 '        (r"^(.*\\.mlp\\.)router\\.layer\\.weight$", r"\\1router.gate.weight", False),\n')
