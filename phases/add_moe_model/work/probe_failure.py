"""What the target's MoE probe raising on an HF block means, and who can fix it (worker side).

The target's ``_probe_hf_moe_block`` raising is an experiment-folder finding (``moe_probe_failed``,
fixable: its helpers learn the block) unless the cause lies where no edit of the experiment folder
reaches: a config that leaves top-k unset, so HF's own block cannot route either (a config
blocker), or a scoring function Titan's router does not have (core).
"""

from __future__ import annotations

from typing import Any

from phases.add_moe_model.compat import CompatIssue
from phases.add_moe_model.work.config_fields import TOP_K_KEYS, read_field
from phases.add_moe_model.work.hf_checks import MOE_REPLACEMENT, TITAN_MOE, resolve_router


def probe_failure_issue(fn_name: str, block: Any, config: Any, exc: Exception) -> CompatIssue:
    """The finding for ``fn_name(block)`` raising ``exc`` on the target."""
    raised = f"{fn_name}({type(block).__name__}) raised {type(exc).__name__}: {exc}"
    router = resolve_router(block)
    hf_top_k = [getattr(owner, "top_k", None) for owner in (block, router) if hasattr(owner, "top_k")]
    if "top_k" in str(exc) and all(read_field(config, k) is None for k in TOP_K_KEYS) and \
            all(k is None for k in hf_top_k):
        return CompatIssue(
            code="config_top_k_unset",
            message=(f"{raised}; the config leaves the experts per token unset (no top-k field has a value) "
                     f"and HF's own {type(block).__name__} reads the same None"
                     f"{' as its top_k' if hf_top_k else ''}, so HF cannot route this config either"),
            fix_location=(f"the model's config ({config.model_type}: num_experts_per_tok), outside the target; "
                          "for type:<model_type>, the class defaults leave it unset (this workflow's MoE form, "
                          "phases/add_moe_model/work/moe_form.py, fills top-k only when the expert count is unset)"),
            severity="blocker",
        )
    scoring = read_field(config, "scoring_func")
    if "scoring function" in str(exc) and scoring not in (None, "softmax", "sigmoid"):
        return CompatIssue(
            code="score_func_unsupported",
            message=(f"{raised}; the config routes with {scoring!r}, and Titan's TokenChoiceTopKRouter scores "
                     "with softmax or sigmoid only"),
            fix_location=(f"{TITAN_MOE} (TokenChoiceTopKRouter: a scoring function), outside the experiment folder "
                          "(a person decides; a router written in the experiment folder would be a workaround)"),
            severity="core",
        )
    return CompatIssue(
        code="moe_probe_failed",
        message=raised,
        fix_location=f"{MOE_REPLACEMENT} ({fn_name} and its _resolve_* helpers)",
        severity="fixable",
    )
