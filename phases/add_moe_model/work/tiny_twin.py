"""The probe's tiny materialized twin and the semantic checks run on it (worker side).

The twin is the real config with every size shrunk, holding one layer of each kind of the real model
(work/layer_plan.py), with random values: the value round trip runs on all of it, the semantic checks
(score placement, output contract, routing) on its first MoE layer, found in the twin, since its indices
are not the real model's. A semantic check that cannot run is a finding with the reason, never a note:
fixable when the frame that raised is the experiment folder's, else a person's to waive (a twin this
workflow scales, a model form the checks do not handle, a raise in transformers or core).
"""

from __future__ import annotations

from typing import Any

from phases.add_moe_model.compat import EXP, CompatIssue, LayerKind
from phases.add_moe_model.work import hf_checks, semantic_checks
from phases.add_moe_model.work.layer_plan import LayerPlan, plan_layers

SCALED_CONFIG = "phases/add_moe_model/work/scaled_config.py"
WAIVE = "or a person waives it: orchestrator resume RUN --waive semantic_checks_not_run --reason TEXT"


def build_tiny_twin(config: Any, kinds: list[LayerKind]) -> tuple[Any | None, LayerPlan | None, str]:
    """(twin, its layer plan, "") or (None, plan, why) when transformers cannot build it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        plan = plan_layers(config, kinds, tiny=True)
        kwargs = {**plan.kwargs, "attn_implementation": "eager"}
        return AutoModelForCausalLM.from_config(AutoConfig.for_model(**kwargs)), plan, ""
    except Exception as exc:  # noqa: BLE001 - no tiny twin means no value round trip (recorded as such), not a crash
        return None, None, " ".join(f"{type(exc).__name__}: {exc}".split())[:300]


def twin_moe_layer(tiny: Any) -> tuple[int, Any] | None:
    """(index, layer) of the twin's first MoE layer with its block, None when it has none."""
    for index, layer in enumerate(tiny.model.layers):
        if hf_checks.probe_moe_site(layer)[0] not in (None, "<layer>"):
            return index, layer
    return None


def check_semantics(tiny: Any, tiny_error: str, moe: dict[str, Any], target: dict[str, Any]) -> list[CompatIssue]:
    """The semantic checks' findings, or a finding saying why they could not run."""
    if moe.get("row") is None or moe.get("params") is None:
        return []  # no MoE, or the target's probe failed: that finding stands and the next probe runs these
    if moe.get("layer_level"):
        return [not_run("the checks read a router and experts inside one MoE block; this model's router and experts "
                        "sit on the decoder layer itself (layer-level MoE), which they do not handle",
                        where=f"phases/add_moe_model/work/semantic_checks.py (the checks); {WAIVE}")]
    if tiny is None:
        return [not_run(f"no tiny twin to run them on: transformers refused the scaled config: {tiny_error}",
                        where=f"{SCALED_CONFIG} (build_scaled_kwargs: a tiny config the model's class accepts); "
                              f"{WAIVE}")]
    found = twin_moe_layer(tiny)
    if found is None:
        return [not_run("the tiny twin built no MoE layer", where=f"{SCALED_CONFIG} (build_scaled_kwargs); {WAIVE}")]
    try:
        return run_semantic_checks(tiny, found[1], target)
    except Exception as exc:  # noqa: BLE001 - the target's own code failing on the twin is a finding, not a crash
        return [raised_on_twin(exc, layer=found[0])]


def run_semantic_checks(tiny: Any, layer: Any, target: dict[str, Any]) -> list[CompatIssue]:
    tiny_config = tiny.config
    tiny_config.load_balance_coeff = None
    tiny_config.comm_backend = "standard"
    _, block = hf_checks.probe_moe_site(layer)
    params = target["moe"]._probe_hf_moe_block(block, tiny_config)
    moe_config = target["moe"]._build_moe_config(params, tiny_config)
    swapped = semantic_checks.swap_like_the_target(target["moe"], layer, moe_config)
    if swapped is None:
        return [CompatIssue(code="semantic_checks_not_run", severity="fixable",
                            message=f"the target's build_and_swap_native_moe put nothing into the tiny twin's MoE "
                                    f"layer ({type(layer).__name__}): no Titan MoE to check",
                            fix_location=f"{EXP}/moe_replacement.py (build_and_swap_native_moe, _get_moe_attr_name)")]
    hidden = int(tiny_config.hidden_size)
    return [*semantic_checks.check_score_placement(block, swapped),
            *semantic_checks.check_output_contract(block, swapped, hidden=hidden),
            *semantic_checks.check_routing(block, swapped, hidden=hidden)]


def raised_on_twin(exc: BaseException, *, layer: int) -> CompatIssue:
    """The twin's checks raised: the experiment folder's to fix when its frame raised, else a person's."""
    from phases.add_moe_model.work.error_origin import describe_error, error_origin

    origin, frame = error_origin(exc)
    said = f"raised on the tiny twin's MoE layer {layer}: {describe_error(exc)}"[:600]
    if frame.startswith(EXP):
        return not_run(said, where=f"{frame.split(':', 1)[0]} ({frame}), in the experiment folder", fixable=True)
    return not_run(said, where=f"{frame or 'no frame recorded'} ({origin}'s code, outside the experiment folder); "
                               f"{WAIVE}")


def not_run(why: str, *, where: str, fixable: bool = False) -> CompatIssue:
    return CompatIssue(code="semantic_checks_not_run", severity="fixable" if fixable else "blocker",
                       message=f"the semantic checks (score placement, MoE output contract, routing rule) did not "
                               f"run: {why}", fix_location=where)
