"""Which findings a fix inside the experiment folder is shown to clear (the fixability contract).

A code in ``PROVEN`` has a reference fix, written inside the experiment folder, that a test
applies to a real run: the finding goes and the run moves on (tests/test_moe_fixability.py,
tests/test_moe_fixability_sharding.py, tests/test_moe_fixability_layouts.py, tests/test_agent_moe_fix.py), or,
where the entry says so, the finding goes while the run stays at the probe on findings a person must decide
(core), which no experiment-folder fix clears. The codes in ``NOT_YET_SHOWN``
point into the experiment folder but no test has cleared them yet; the survey says which is which,
so a ``needs_agent`` row promises only what has been shown (tests/test_moe_fixability_contract.py
reads every fixable code from the checks and fails for one in neither list).
"""

from __future__ import annotations

PROVEN: dict[str, str] = {
    "moe_attr_not_mlp": "Llama-4-Scout",
    "score_func_mismatch": "Llama-4-Scout, afmoe",
    "experts_transposed": "Llama-4-Scout, aria_text",
    "strict_load_shape_mismatch": "Llama-4-Scout, aria_text",
    "router_score_before_experts": "Llama-4-Scout",
    "moe_output_contract": "Llama-4-Scout",
    "router_bias_key_misnamed": "DeepSeek-V3, mimo_v2_flash",
    "router_rule_mismatch": "laguna (the probe worker on the fixed target)",
    "correction_bias_outside_gate": "HY-V3",
    "state_dict_keys_unmapped": "ernie4_5_moe (a correction bias in gate.moe_statics, (1, E) both ways), "
                                "hunyuan_v1_moe (router gate.wg, shared_mlp), "
                                "afmoe (router already at router.gate, expert_bias on the block)",
    "module_without_sharding_config": "hunyuan_v1_moe (per-head query/key layernorms), "
                                      "afmoe (norms around the MoE, attention output gate)",
    "state_missing_from_sharding_config": "mimo_v2_flash (attention sinks sharded with the heads)",
    "attention_projection_unhandled": "qwen3_next (linear_attn layers configured replicated; TP 2 build check)",
    "roundtrip_failed": "afmoe (the reverse pattern sent the block's expert_bias to gate.e_score_correction_bias)",
    # gpt_oss is the one model with these two; its run then stays at the probe on its core findings (expert
    # biases, clamped SwiGLU: a person's call) and the expert-bias keys the strict load cannot place.
    "gate_up_interleaved": "gpt_oss (de-interleaved and re-interleaved in the adapter; its core findings remain)",
    "router_bias_dropped": "gpt_oss (router gate built with bias, router.bias mapped; its core findings remain)",
    # JetMoe, the one model with experts outside an ``experts`` module: its run then stays at the probe on its
    # MoE output bias (core: no place in Titan's MoE) and its mixture-of-attention layer.
    "experts_outside_experts_module": "jetmoe (input_linear/output_linear read and converted; its output bias, "
                                      "core, remains)",
    "moe_probe_failed": "jetmoe (the probe read block.experts; a config without top-k or a scoring function Titan's "
                        "router lacks is a person's finding instead)",
    # Fixable only where the experiment folder's frame raised on the tiny twin (the target's swap not finding the
    # MoE); elsewhere it is a person's (a blocker naming who raised).
    "semantic_checks_not_run": "Llama-4-Scout (the swap finds the MoE under feed_forward: the checks run and find "
                               "their two findings)",
}

# Fixable codes whose reference fix is not written yet, and why each is still called fixable: its fix
# belongs in the experiment folder (tests/test_moe_fixability_contract.py keeps both lists complete).
# Empty: a new fixable check comes with its reference fix, or is listed here with where its fix goes.
NOT_YET_SHOWN: dict[str, str] = {}


def clearable_note(code: str) -> str:
    """' [clearable in the experiment folder: reference fix tested on X]', or what is not shown yet."""
    if code in PROVEN:
        return f" [clearable in the experiment folder: reference fix tested on {PROVEN[code]}]"
    return " [experiment-folder fix not yet shown by a test]"
