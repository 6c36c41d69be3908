"""Bugs an agent can leave in the experiment folder that the numerics phase finds, and their reference fixes.

Each ``Slip`` is one edit inside torchtitan 0.3.0's experiment folder: ``leave`` writes the bug as an agent
would, ``fix`` is the reference fix (the edit that clears the numerics finding). Both are replace-once edits
(tests.moe_reference_fixes.replace_once), so a changed upstream text fails loudly instead of testing nothing.
The model is Qwen3-30B-A3B (128 experts); the numerics phase's synthetic twin has 8, so a value the agent
tied to the real model's expert count passes the probe (it builds the real config) and breaks numerics.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.moe_reference_fixes import ADAPTER, MOE, replace_once


@dataclass(frozen=True)
class Slip:
    """A bug in one experiment-folder file: ``good`` is the text the fix restores, ``bad`` what the bug wrote."""

    code: str
    """The numerics finding the bug raises."""
    path: str
    good: str
    bad: str

    def leave(self, target: Path) -> None:
        replace_once(target, self.path, self.good, self.bad)

    def fix(self, target: Path) -> None:
        replace_once(target, self.path, self.bad, self.good)


TOP_K = "    top_k = _resolve_top_k(moe_block, gate, config)\n"
NUM_EXPERTS = "    num_experts = _resolve_num_experts(experts, gate, moe_block, config)\n"
DOWN = '            titan_state_dict[f"{prefix}{_TITAN_EXPERTS_PREFIX}.{down_name}"] = value\n'
ROUTER = '        (r"^(.*\\.)gate\\.weight$", r"\\1router.gate.weight", False),\n'

# top-k looked up by the real model's expert count: KeyError 8 in _probe_hf_moe_block on the synthetic model.
TOP_K_BY_EXPERT_COUNT = Slip("numerics_error", MOE, TOP_K,
                             "    top_k = {128: 8}[num_experts]  # Qwen3-30B-A3B routes 8 of its 128 experts\n")
# A guard written for the real model's expert-parallel plan: the probe's ValueError on the synthetic model.
EXPERT_COUNT_GUARD = Slip("probe_value_error", MOE, NUM_EXPERTS, NUM_EXPERTS + (
    "    if num_experts % 64:\n"
    '        raise ValueError(f"_probe_hf_moe_block: {num_experts} experts do not split over 64 EP ranks")\n'))
# Aria's transposed down_proj copied onto a model that stores it (E, H, I): the load's size mismatch, and the
# round trip (converted one way only) gives back a transposed tensor.
DOWN_TRANSPOSED = Slip("adapter_shape_mismatch", ADAPTER, DOWN, DOWN.replace("= value\n", "= value.transpose(1, 2)\n"))
# The router's Titan key without its ``gate`` level: the key comes back to HF (recorded on the way in), so the
# round trip passes, but Titan's MoE has no ``router.weight`` and its ``router.gate.weight`` stays unloaded.
ROUTER_KEY_MISNAMED = Slip("adapter_keys_dropped", ADAPTER, ROUTER,
                           ROUTER.replace("router.gate.weight", "router.weight"))
