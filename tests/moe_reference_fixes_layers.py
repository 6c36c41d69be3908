"""Reference fixes for a model whose decoder layers are of several kinds (bailing_hybrid), written as an agent would.

Same rules as tests/moe_reference_fixes.py: each replacement must match exactly once in torchtitan 0.3.0's
experiment folder. bailing_hybrid (Ling 3) has 42 layers: Kimi delta attention (linear, with a short
convolution over its q/k/v channels) at ``self_attn`` on five of every six, and MLA with full-rank Q and a
head-wise output gate (``g_proj``) on the sixth; the first two layers have a dense MLP. ``linear_layers`` is
the fix the blind trial's agent wrote (its linear layers only); ``mla_layers`` the rest.
"""

from __future__ import annotations

from pathlib import Path

from tests.moe_reference_fixes import EXP, expert_bias_key_renamed, replace_once
from tests.moe_reference_fixes_sharding import linear_attention_layers

SHARDING = f"{EXP}/hf_sharding.py"
PARALLELIZE = f"{EXP}/parallelize.py"

SELF_ATTN_MIXERS = (
    "    if getattr(layer, \"self_attn\", None) is not None:\n"
    "        _set_attention_configs(layer.self_attn, enable_sp=enable_sp)\n"
)
LINEAR_AT_SELF_ATTN = '''    # Ling 3 (bailing_hybrid) keeps its Kimi delta attention at ``self_attn``; its short
    # convolution over the q/k/v channels marks it as linear attention, configured replicated.
    self_attn = getattr(layer, "self_attn", None)
    if self_attn is not None and hasattr(self_attn, "conv1d"):
        _set_linear_attention_configs(self_attn, enable_sp=enable_sp)
    elif self_attn is not None:
        _set_attention_configs(self_attn, enable_sp=enable_sp)
'''
CP_TEST = ('    if parallel_dims.cp_enabled and any(\n'
           '        getattr(block, "linear_attn", None) is not None for block in model.layers\n'
           '    ):\n')
CP_TEST_WITH_SELF_ATTN = (
    '    if parallel_dims.cp_enabled and any(\n'
    '        getattr(block, "linear_attn", None) is not None\n'
    '        or hasattr(getattr(block, "self_attn", None), "conv1d")\n'
    '        for block in model.layers\n'
    '    ):\n'
)


def linear_layers(target: Path) -> None:
    """The linear-attention kinds (layers 0-4, 6-10, ...) and the router's correction bias key: replicated mixers
    (``_set_linear_attention_configs`` of the qwen3_next fix), also where the mixer sits at ``self_attn``."""
    expert_bias_key_renamed(target)
    linear_attention_layers(target)
    replace_once(target, SHARDING, SELF_ATTN_MIXERS, LINEAR_AT_SELF_ATTN)
    replace_once(target, PARALLELIZE, CP_TEST, CP_TEST_WITH_SELF_ATTN)


def mla_layers(target: Path) -> None:
    """The full-attention kind (layers 5, 11, ..., 41): MLA whose absent low-rank Q projections are ``None``
    children (hasattr() is True for them), and a head-wise output gate sharded as the heads are."""
    replace_once(target, SHARDING, '    if hasattr(attn, "q_a_proj"):\n',
                 '    if getattr(attn, "q_a_proj", None) is not None:\n')
    replace_once(target, SHARDING, '        if hasattr(attn, "q_b_proj"):\n',
                 '        if getattr(attn, "q_b_proj", None) is not None:\n')
    replace_once(target, SHARDING, "    # Q/K norms (Qwen3)",
                 "    # Head-wise output gate (Ling 3 MLA): one value per head, so it is sharded as\n"
                 "    # the heads are (colwise), like q/k/v.\n"
                 '    if getattr(attn, "g_proj", None) is not None:\n'
                 "        attn.g_proj._sharding_config = colwise_config()\n\n"
                 "    # Q/K norms (Qwen3)")


def both_kinds(target: Path) -> None:
    linear_layers(target)
    mla_layers(target)
