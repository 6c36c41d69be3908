"""Reference fixes inside the experiment folder, written as an agent would, one per finding.

Each fix edits the target's ``torchtitan/experiments/transformers_modeling_backend`` only (the
scope an agent may write) and is the evidence that a finding labelled fixable can be cleared:
tests/test_moe_fixability.py applies them and shows the finding gone and the run moving on.
They target torchtitan 0.3.0's experiment folder (the embedded workspace); each replacement
must match exactly once, so a changed upstream text fails loudly instead of fixing nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

EXP = "torchtitan/experiments/transformers_modeling_backend"
MODEL = f"{EXP}/model.py"
MOE = f"{EXP}/moe_replacement.py"
ADAPTER = f"{EXP}/state_dict_adapter.py"

Fix = Callable[[Path], None]


def replace_once(target: Path, path: str, old: str, new: str) -> None:
    file = target / path
    text = file.read_text()
    assert text.count(old) == 1, f"{path}: expected one match of {old[:60]!r}, found {text.count(old)}"
    file.write_text(text.replace(old, new))


def moe_under_feed_forward(target: Path) -> None:
    """moe_attr_not_mlp: both detections also look under ``feed_forward`` (Llama 4, Jamba)."""
    replace_once(target, MODEL, '    return "mlp" if hasattr(layer, "mlp") else None\n',
                 '    if hasattr(layer, "mlp"):\n        return "mlp"\n'
                 '    return "feed_forward" if hasattr(layer, "feed_forward") else None\n')
    replace_once(target, MOE, '    if hasattr(layer, "mlp"):\n        return "mlp"\n',
                 '    if hasattr(layer, "mlp"):\n        return "mlp"\n'
                 '    if hasattr(layer, "feed_forward"):\n        return "feed_forward"\n')


def sigmoid_router(target: Path) -> None:
    """score_func_mismatch: Llama 4's router scores with sigmoid and has no correction bias to tell."""
    replace_once(target, MOE, '    scoring_func = getattr(config, "scoring_func", None)\n',
                 '    if gate is not None and type(gate).__name__ == "Llama4Router":\n'
                 '        return "sigmoid"\n\n'
                 '    scoring_func = getattr(config, "scoring_func", None)\n')


def laguna_router(target: Path) -> None:
    """router_rule_mismatch (laguna): its router keeps the correction bias as a parameter, not a buffer (so the
    target's test for a sigmoid router misses it and routes with softmax), and always renormalises the top-k
    weights without a norm_topk_prob flag (so the target's sigmoid default leaves them unnormalised)."""
    bias_test = '"e_score_correction_bias" in getattr(gate, "_buffers", {})'
    replace_once(target, MOE, f"    if gate is not None and {bias_test}:\n",
                 f"    if gate is not None and ({bias_test}\n"
                 '                             or "e_score_correction_bias" in getattr(gate, "_parameters", {})):\n')
    replace_once(target, MOE, "    elif hasattr(gate, \"norm_topk_prob\"):\n        route_norm = gate.norm_topk_prob\n",
                 "    elif hasattr(gate, \"norm_topk_prob\"):\n        route_norm = gate.norm_topk_prob\n"
                 "    elif type(gate).__name__ == \"LagunaTopKRouter\":\n        route_norm = True\n")


def block_level_correction_bias(target: Path) -> None:
    """correction_bias_outside_gate (HY-V3): its MoE block, not its gate, holds e_score_correction_bias, and its
    router always renormalises the top-k weights then scales them by ``router_scaling_factor``."""
    # 0.3.0's Titan MoE names the buffer expert_bias_E (the DeepSeek-V3 finding router_bias_key_misnamed).
    replace_once(target, ADAPTER, '        (r"^(.*\\.)gate\\.e_score_correction_bias$", r"\\1expert_bias", False),\n',
                 '        (r"^(.*\\.)gate\\.e_score_correction_bias$", r"\\1expert_bias", False),\n'
                 '        (r"^(.*\\.)e_score_correction_bias$", r"\\1expert_bias_E", False),\n')
    replace_once(target, MOE, "    # Router scoring function\n    score_func = _resolve_score_func(gate, config)\n",
                 "    # Router scoring function\n    score_func = _resolve_score_func(gate, config)\n"
                 '    if "e_score_correction_bias" in getattr(moe_block, "_buffers", {}):\n'
                 '        score_func = "sigmoid"\n')
    replace_once(target, MOE, "    elif hasattr(gate, \"norm_topk_prob\"):\n        route_norm = gate.norm_topk_prob\n",
                 "    elif hasattr(gate, \"norm_topk_prob\"):\n        route_norm = gate.norm_topk_prob\n"
                 "    elif hasattr(gate, \"router_scaling_factor\"):\n        route_norm = True\n")
    replace_once(target, MOE, '    # Route scaling factor (DeepSeek V2/V3)\n'
                 '    route_scale = getattr(config, "routed_scaling_factor", 1.0)\n',
                 '    # Route scaling factor (DeepSeek V2/V3)\n'
                 '    route_scale = getattr(config, "routed_scaling_factor",\n'
                 '                          getattr(gate, "router_scaling_factor", 1.0))\n')


TRANSPOSED_HELPERS = '''
_TRANSPOSED_EXPERT_PREFIXES: set[str] = set()


def _transposed_expert_prefixes(state_dict: dict[str, torch.Tensor]) -> set[str]:
    """Prefixes whose experts are stored (E, H, 2I) / (E, I, H), the layout grouped_mm takes (Aria, Llama 4)."""
    found = set()
    for key, gate_up in state_dict.items():
        if key.endswith(".experts.gate_up_proj"):
            prefix = key[: -len("experts.gate_up_proj")]
            down = state_dict.get(f"{prefix}experts.down_proj")
            if down is not None and down.shape[1] * 2 == gate_up.shape[2] and down.shape[2] == gate_up.shape[1]:
                found.add(prefix)
    _TRANSPOSED_EXPERT_PREFIXES.update(found)
    return found


def hf_to_titan_moe_state_dict(
'''


def transposed_experts(target: Path) -> None:
    """experts_transposed (and the strict load it breaks): transpose both ways, read I from dim 2."""
    replace_once(target, ADAPTER, "\n\ndef hf_to_titan_moe_state_dict(\n", "\n" + TRANSPOSED_HELPERS)
    replace_once(target, ADAPTER, "    titan_state_dict = {}\n\n    for key, value in hf_state_dict.items():\n",
                 "    titan_state_dict = {}\n    transposed = _transposed_expert_prefixes(hf_state_dict)\n\n"
                 "    for key, value in hf_state_dict.items():\n"
                 "        if key.endswith(('.experts.gate_up_proj', '.experts.down_proj')) and \\\n"
                 "                key.rsplit('experts.', 1)[0] in transposed:\n"
                 "            value = value.transpose(1, 2)\n")
    replace_once(target, ADAPTER, "            hf_state_dict[hf_key] = fused_value\n",
                 "            if prefix in _TRANSPOSED_EXPERT_PREFIXES:\n"
                 "                fused_value = fused_value.transpose(1, 2)\n"
                 "            hf_state_dict[hf_key] = fused_value\n")
    replace_once(target, ADAPTER, "            hf_state_dict[key] = value\n\n    return hf_state_dict\n",
                 "            hf_state_dict[key] = value\n\n"
                 "    for prefix in _TRANSPOSED_EXPERT_PREFIXES:\n"
                 "        down = f'{prefix}experts.down_proj'\n"
                 "        if down in hf_state_dict:\n"
                 "            hf_state_dict[down] = hf_state_dict[down].transpose(1, 2)\n"
                 "    return hf_state_dict\n")
    replace_once(target, MOE, "    if hasattr(experts, \"gate_up_proj\"):\n"
                 "        moe_intermediate_size = experts.gate_up_proj.shape[1] // 2\n",
                 "    if hasattr(experts, \"gate_up_proj\"):\n"
                 "        shape = experts.gate_up_proj.shape\n"
                 "        moe_intermediate_size = (shape[2] if shape[1] == dim else shape[1]) // 2\n")


SCORE_DISPATCHER = '''

class _ScoreBeforeExpertsDispatcher(LocalTokenDispatcher):
    """Scale each routed token by its score before the experts (Llama 4), not their outputs at combine."""

    @dataclass(kw_only=True, slots=True)
    class Config(LocalTokenDispatcher.Config):
        pass

    def dispatch(self, x_TD, topk_scores_TK, topk_expert_ids_TK, num_local_tokens_per_expert_E):
        routed, counts, meta = super().dispatch(x_TD, topk_scores_TK, topk_expert_ids_TK,
                                                num_local_tokens_per_expert_E)
        scores = meta.topk_scores_experts_sorted_N
        routed = (routed.to(torch.float32) * scores.reshape(-1, 1)).to(routed.dtype)
        return routed, counts, dataclasses.replace(meta, topk_scores_experts_sorted_N=torch.ones_like(scores))
'''

TUPLE_MOE = '''

class _HFTupleMoE(_HFContiguousMoE):
    """Llama 4's decoder layer unpacks (hidden_states, router_logits) from its MoE."""

    def forward(self, hidden_states: torch.Tensor):
        return super().forward(hidden_states), None
'''
PHASE_1 = "\n\n# " + "-" * 75 + "\n# Phase 1 — config preparation"


def score_before_experts(target: Path) -> None:
    """router_score_before_experts: a dispatcher in the experiment folder scales the routed input."""
    replace_once(target, MOE, PHASE_1, SCORE_DISPATCHER + PHASE_1)
    replace_once(target, MOE, "    shared_experts = None\n    shared_info = params[\"shared_expert_info\"]\n",
                 "    if getattr(config, \"model_type\", \"\").startswith(\"llama4\"):\n"
                 "        routed_experts.token_dispatcher = _ScoreBeforeExpertsDispatcher.Config(\n"
                 "            num_experts=params[\"num_experts\"], top_k=params[\"top_k\"])\n\n"
                 "    shared_experts = None\n    shared_info = params[\"shared_expert_info\"]\n")
    replace_once(target, MOE, "\nfrom functools import partial\n",
                 "\nimport dataclasses\nfrom dataclasses import dataclass\nfrom functools import partial\n"
                 "\nfrom torchtitan.models.common.token_dispatcher import LocalTokenDispatcher\n")


def tuple_output(target: Path) -> None:
    """moe_output_contract: the module swapped into a Llama 4 layer returns the tuple the layer unpacks."""
    replace_once(target, MOE, PHASE_1, TUPLE_MOE + PHASE_1)
    replace_once(target, MOE, "        native_moe.__class__ = _HFContiguousMoE\n",
                 "        native_moe.__class__ = _HFTupleMoE if getattr(layer, \"is_moe_layer\", False) "
                 "else _HFContiguousMoE\n")


MOE_STATICS = "gate.moe_statics.e_score_correction_bias"


def moe_statics_correction_bias(target: Path) -> None:
    """state_dict_keys_unmapped (ERNIE 4.5): the correction bias sits in ``gate.moe_statics`` shaped (1, E);
    Titan's MoE keeps it as ``expert_bias_E`` shaped (E,). Converted both ways, the HF shape remembered."""
    replace_once(target, ADAPTER, "\n\ndef hf_to_titan_moe_state_dict(\n",
                 "\n\n# titan key -> (HF key, HF shape) of correction biases held in gate.moe_statics\n"
                 "_MOE_STATICS_BIAS: dict[str, tuple[str, tuple[int, ...]]] = {}\n"
                 "\n\ndef hf_to_titan_moe_state_dict(\n")
    replace_once(target, ADAPTER, "        # Handle expert down_proj rename.\n",
                 f"        if key.endswith(\".{MOE_STATICS}\"):\n"
                 f"            titan_key = key[: -len(\"{MOE_STATICS}\")] + \"expert_bias_E\"\n"
                 "            _MOE_STATICS_BIAS[titan_key] = (key, tuple(value.shape))\n"
                 "            titan_state_dict[titan_key] = value.reshape(-1)\n"
                 "            continue\n\n"
                 "        # Handle expert down_proj rename.\n")
    replace_once(target, ADAPTER, "        if key in _TITAN_TO_ORIGINAL_HF_KEY:\n",
                 "        if key in _MOE_STATICS_BIAS:\n"
                 "            hf_key, shape = _MOE_STATICS_BIAS[key]\n"
                 "            hf_state_dict[hf_key] = value.reshape(shape)\n"
                 "            continue\n\n"
                 "        if key in _TITAN_TO_ORIGINAL_HF_KEY:\n")


SHARDING = f"{EXP}/hf_sharding.py"


def per_head_qk_layernorms(target: Path) -> None:
    """module_without_sharding_config (Hunyuan): its per-head query/key layernorms are Qwen3's q_norm/k_norm
    under other names, so they take the same config (weights replicated, activations stay heads-sharded)."""
    replace_once(target, SHARDING, '    for norm_name in ("q_norm", "k_norm"):\n',
                 '    for norm_name in ("q_norm", "k_norm", "query_layernorm", "key_layernorm"):\n')


def hunyuan_router_and_shared_keys(target: Path) -> None:
    """state_dict_keys_unmapped (Hunyuan): the router weight is ``gate.wg`` and the shared expert ``shared_mlp``.
    Only the HF -> Titan side needs patterns: the reverse side takes the keys it recorded on the way in."""
    pattern = '        (r"^(.*\\.)shared_mlp\\.{hf}_proj\\.weight$", r"\\1shared_experts.{titan}.weight", False),\n'
    extra = "".join(pattern.format(hf=hf, titan=titan) for hf, titan in (("gate", "w1"), ("up", "w3"), ("down", "w2")))
    replace_once(target, ADAPTER, '        (r"^(.*\\.)router\\.proj\\.weight$", r"\\1router.gate.weight", False),\n',
                 '        (r"^(.*\\.)router\\.proj\\.weight$", r"\\1router.gate.weight", False),\n'
                 '        (r"^(.*\\.)gate\\.wg\\.weight$", r"\\1router.gate.weight", False),\n' + extra)


def sinks_sharded_with_heads(target: Path) -> None:
    """state_missing_from_sharding_config (attention sinks, one logit per head): q_proj's colwise config shards
    the heads, so the attention module declares its sinks sharded on dim 0 the same way."""
    replace_once(target, SHARDING, "    # Flex attention: attach the kernel Module",
                 '    if isinstance(getattr(attn, "sinks", None), nn.Parameter):\n'
                 '        attn._sharding_config.state_shardings["sinks"] = dense_param_placement(tp=spmd.S(0))\n\n'
                 "    # Flex attention: attach the kernel Module")


def expert_bias_key_renamed(target: Path) -> None:
    """router_bias_key_misnamed: both pattern tables name the buffer Titan's MoE holds, expert_bias_E."""
    replace_once(target, ADAPTER, 'r"\\1expert_bias", False)', 'r"\\1expert_bias_E", False)')
    replace_once(target, ADAPTER, '(r"^(.*\\.)expert_bias$",', '(r"^(.*\\.)expert_bias_E$",')


LLAMA4: tuple[Fix, ...] = (moe_under_feed_forward, sigmoid_router, transposed_experts, score_before_experts,
                           tuple_output)
ARIA: tuple[Fix, ...] = (transposed_experts,)


def apply(target: Path, fixes: tuple[Fix, ...]) -> None:
    for fix in fixes:
        fix(target)
