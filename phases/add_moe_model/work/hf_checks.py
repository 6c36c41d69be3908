"""Cross-checks of the target's MoE probe against the HF modules themselves (worker side).

The target's ``_probe_hf_moe_block`` reads config attributes and module attributes; it
never looks at what the HF forward does. These checks read the HF classes (their
parameters and their source) and turn every silent disagreement into an issue: a router
that calls sigmoid while the probe says softmax, a correction bias outside the gate,
router parameters Titan's router has no place for, transposed experts,
expert biases, a non-SiLU expert activation, experts stored outside ``mlp``.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from phases.add_moe_model.compat import EXP, CompatIssue
from phases.add_moe_model.work.config_fields import read_field

MOE_REPLACEMENT = f"{EXP}/moe_replacement.py"
STATE_DICT_ADAPTER = f"{EXP}/state_dict_adapter.py"
MODEL_PY = f"{EXP}/model.py"
TITAN_MOE = "torchtitan/models/common/moe.py"
_ROUTER_KNOWN_STATE = {"weight", "bias", "e_score_correction_bias"}
_SILU = {"silu", "swish"}


RAISES = "raises "
"""Prefix of a target answer that was an exception (``_get_moe_attr_name`` raising for the layer)."""


def probe_moe_site(layer: Any) -> tuple[str | None, Any | None]:
    """Return (attribute, block) of the layer's MoE: a child with gate/router + experts,
    or ("<layer>", layer) for layer-level MoE, or (None, None) for a dense layer.

    The experts are an ``experts`` module, or stacked expert weights (3-D parameters) held
    elsewhere in the block (JetMoe's ``input_linear``/``output_linear``).
    """
    for name, child in layer.named_children():
        if _has_router(child) and _holds_experts(child):
            return name, child
    if _has_router(layer) and hasattr(layer, "experts"):
        return "<layer>", layer
    return None, None


MOE_CLASS = re.compile(r"MoE|Moe|Experts")


def check_unrecognized_moe(layers: list[Any]) -> list[CompatIssue]:
    """An MoE-named block with no router + experts Titan's MoE could hold (Doge's product-key retrieval MoE:
    a key projection and expert embedding tables) is a form Titan's MoE lacks: a core finding, not a dense model."""
    for index, layer in enumerate(layers):
        for name, child in layer.named_children():
            if MOE_CLASS.search(type(child).__name__):
                parts = ", ".join(f"{n} {type(m).__name__}{_dims(m)}" for n, m in child.named_children()) or "none"
                return [CompatIssue(
                    code="moe_form_unsupported",
                    message=(f"layer {index}'s {name} is {type(child).__name__}, an MoE block with no router "
                             f"(gate/router) and experts that Titan's MoE could hold (its parts: {parts}); Titan's "
                             "MoE is a token-choice router over grouped experts and has no such form"),
                    fix_location=f"{TITAN_MOE} (MoE), outside the experiment folder: a new MoE form, a core change",
                    severity="core")]
    return []


def _dims(module: Any) -> str:
    weight = getattr(module, "weight", None)
    return f" weight {tuple(weight.shape)}" if weight is not None and hasattr(weight, "shape") else ""


def _holds_experts(block: Any) -> bool:
    if hasattr(block, "experts"):
        return True
    router = resolve_router(block)
    routed = {id(p) for p in router.parameters()} if router is not None else set()
    return any(p.dim() == 3 and id(p) not in routed for p in block.parameters())


def check_expert_container(block: Any, attr: str, *, probed: bool, strict: Any) -> list[CompatIssue]:
    """A block whose stacked expert weights sit outside an ``experts`` module, judged on what the target does
    with it: the finding stands while the target's probe builds no Titan MoE from the block, or the strict load
    of the target's conversion leaves the stacked weights, Titan's expert weights or the router unmatched."""
    holders = sorted({name.rsplit(".", 1)[0] for name, p in block.named_parameters() if p.dim() == 3})
    kinds = sorted({type(block.get_submodule(h)).__name__ for h in holders})
    unmatched = [k for k in strict.unexpected if k.split(".")[0] in {*holders, "router", "gate"}]
    unmatched += [k for k in strict.missing if "inner_experts" in k or k.startswith("router.")]
    if probed and not unmatched:
        return []
    did = (f"its strict load leaves {unmatched[:6]} unmatched" if probed else
           "the target's _probe_hf_moe_block builds no Titan MoE from it (it reads block.experts)")
    return [CompatIssue(
        code="experts_outside_experts_module",
        message=(f"the MoE block at layer.{attr} ({type(block).__name__}) keeps its stacked expert weights in "
                 f"{', '.join(holders)} ({', '.join(kinds)}), not in an `experts` module; {did}"),
        fix_location=f"{MOE_REPLACEMENT} (_probe_hf_moe_block) and {STATE_DICT_ADAPTER}",
        severity="fixable")]


def check_block_output_bias(block: Any, *, hidden: int, probed: bool, strict: Any) -> list[CompatIssue]:
    """A bias the block adds to its whole output (JetMoe), while the target's Titan MoE has no place for it."""
    placeless = [n for n in _output_biases(block, hidden) if not probed or n in strict.unexpected]
    if not placeless:
        return []
    return [CompatIssue(
        code="moe_output_bias_unsupported",
        message=(f"{type(block).__name__} adds {placeless} ({hidden},) to its output after combining the experts; "
                 + ("the target builds no Titan MoE from the block" if not probed else
                    "the Titan MoE the target builds has no such parameter (its strict load leaves it unmatched)")),
        fix_location=f"{TITAN_MOE} (MoE: an output bias), outside the experiment folder (a person decides; an MoE "
                     "subclass in the experiment folder would be a workaround)",
        severity="core")]


def _output_biases(block: Any, hidden: int) -> list[str]:
    return [n for n, p in block.named_parameters(recurse=False)
            if p.dim() == 1 and int(p.shape[0]) == hidden and n.endswith("bias")
            and not any(w in n for w in ("expert", "correction", "score"))]


def placeless_state(block: Any, *, hidden: int) -> frozenset[str]:
    """Block-relative names of HF state Titan's MoE has no place for, each a core finding's: per-expert
    biases (expert_bias_unsupported) and an output bias (moe_output_bias_unsupported)."""
    import torch.nn as nn

    experts = getattr(block, "experts", None)
    stacked = experts is not None and not isinstance(experts, nn.ModuleList)
    expert_biases = {f"experts.{n}" for n in _own_state_names(experts, prefix="") if "bias" in n} if stacked else set()
    return frozenset(expert_biases | set(_output_biases(block, hidden)))


def resolve_router(block: Any) -> Any | None:
    """Return the router module of an MoE block (``gate`` first, then ``router``)."""
    return getattr(block, "gate", None) or getattr(block, "router", None)


def check_moe_site(attr: str | None, *, target_attrs: dict[str, str | None]) -> list[CompatIssue]:
    """The target must find the MoE where it is: every ``_get_moe_attr_name`` of the target must name ``attr``.

    ``target_attrs`` maps each of the target's files to what its ``_get_moe_attr_name`` returned for the
    layer (None when it returned None or raised), so the finding clears as soon as the target's own code
    finds the block, whatever the fix looks like.
    """
    if attr in (None, "<layer>"):
        return []
    wrong = {path: found for path, found in target_attrs.items() if found != attr}
    if not wrong:
        return []
    said = "; ".join(f"{path} _get_moe_attr_name {_answer_text(found)}" for path, found in wrong.items())
    return [
        CompatIssue(
            code="moe_attr_not_mlp",
            message=f"the MoE block lives at layer.{attr}, but {said}, so the layer is not detected as MoE "
                    "and keeps HF's experts",
            fix_location=" and ".join(f"{path} (_get_moe_attr_name)" for path in wrong),
            severity="fixable",
        )
    ]


def _answer_text(found: str | None) -> str:
    return found if found is not None and found.startswith(RAISES) else f"gives {found!r}"


def probe_hf_score_func(router: Any, block: Any) -> str | None:
    """Read the router/block source: "sigmoid" or "softmax" when only one is used, else None."""
    text = "\n".join(
        line
        for cls in {type(router), type(block)}
        for line in _class_source(cls).splitlines()
        if "shared" not in line and not line.lstrip().startswith("#")
    )
    uses = {name for name in ("sigmoid", "softmax") if re.search(rf"\b{name}\b", text)}
    return uses.pop() if len(uses) == 1 else None


def check_score_func(router: Any, block: Any, *, probed: str | None) -> list[CompatIssue]:
    """The probe's score_func must match what the HF routing code calls."""
    hf_score = probe_hf_score_func(router, block)
    if hf_score is None or probed is None or hf_score == probed:
        return []
    return [
        CompatIssue(
            code="score_func_mismatch",
            message=(
                f"{type(router).__name__}/{type(block).__name__} route with {hf_score} but the "
                f"target's probe says {probed!r}; Titan would route with the wrong function"
            ),
            fix_location=f"{MOE_REPLACEMENT} (_resolve_score_func)",
            severity="fixable",
        )
    ]


def check_correction_bias(block: Any, router: Any, *, strict: Any) -> list[CompatIssue]:
    """A score-correction bias off the gate, while the target's strict load leaves it unmapped.

    The target's adapter maps only ``gate.e_score_correction_bias`` to Titan's ``expert_bias``; a bias
    elsewhere (HY-V3 keeps it on the MoE block) stands as a finding until the strict load of the
    target's own conversion carries it (neither left over on the HF side nor missing on Titan's).
    """
    router_ids = {id(m) for m in router.modules()} if router is not None else set()
    stray = [
        name
        for mod_name, mod in block.named_modules()
        if id(mod) not in router_ids
        for name in _own_state_names(mod, prefix=mod_name)
        if "correction" in name or "score_bias" in name
    ]
    unmapped = any(name in strict.unexpected for name in stray) or any(
        key.startswith("expert_bias") for key in strict.missing)
    if not stray or not unmapped:
        return []
    return [
        CompatIssue(
            code="correction_bias_outside_gate",
            message=f"score-correction bias {stray} is not on the router module, so sigmoid scoring and the "
                    "expert_bias mapping miss it",
            fix_location=f"{MOE_REPLACEMENT} (_resolve_score_func) and "
                         f"{STATE_DICT_ADAPTER} (_build_hf_to_titan_patterns)",
            severity="fixable",
        )
    ]


def check_router_state(router: Any) -> list[CompatIssue]:
    """Router parameters beyond weight/bias/correction bias have no place in Titan's router (a router bias is
    judged on the target: conversion_checks.check_router_bias)."""
    extra = [n for n in _own_state_names(router, prefix="", recurse=True)
             if n.split(".")[-1] not in _ROUTER_KNOWN_STATE]
    issues = []
    if extra:
        issues.append(
            CompatIssue(
                code="router_scale_ignored",
                message=(
                    f"{type(router).__name__} scales routing with {extra}; the target's probe ignores them "
                    "and Titan's TokenChoiceTopKRouter has no such parameters"
                ),
                fix_location=f"{TITAN_MOE} (TokenChoiceTopKRouter), outside the experiment folder",
                severity="core",
            )
        )
    return issues


def check_experts(experts: Any, config: Any) -> list[CompatIssue]:
    """Expert storage Titan's GroupedExperts (fused, (E, 2I, H), SiLU, no bias) can take."""
    import torch.nn as nn

    if isinstance(experts, nn.ModuleList):
        return [
            CompatIssue(
                code="experts_module_list",
                message=f"experts are an nn.ModuleList of {type(experts[0]).__name__}; "
                        "Titan needs fused 3D expert tensors",
                fix_location="HF transformers modeling code (upstream): no fix in torchtitan",
                severity="blocker",
            )
        ]
    return [
        *_check_expert_bias(experts),
        *_check_expert_activation(experts, config),
    ]


def hf_experts_transposed(experts: Any, *, hidden: int) -> bool:
    """HF stores ``gate_up_proj`` as (E, H, 2I) (the layout grouped_mm consumes) instead of (E, 2I, H)."""
    gate_up = getattr(experts, "gate_up_proj", None)
    return gate_up is not None and gate_up.shape[1] == hidden and gate_up.shape[2] != hidden


def check_expert_layout(experts: Any, *, hidden: int, strict: Any,
                        probed_intermediate: int | None) -> list[CompatIssue]:
    """Transposed experts, judged on what the target does with them.

    HF's layout alone is no finding: it is one while the target's conversion does not fit Titan's
    experts (the strict load's shapes) or the target's probe reads the wrong intermediate size.
    """
    if not hf_experts_transposed(experts, hidden=hidden):
        return []
    real = int(experts.gate_up_proj.shape[2]) // 2
    # Judged on the expert weights only: a strict load that fails on other keys (gpt_oss's expert biases,
    # a router key) has its own findings and says nothing about this layout.
    unmatched = [k for k in (*strict.missing, *strict.unexpected) if _is_expert_weight_key(k)]
    shape_ok = not strict.shape_mismatch and not unmatched and (strict.verdict == "PASS" or bool(strict.checked_keys))
    if shape_ok and probed_intermediate == real:
        return []
    wrong = []
    if probed_intermediate != real:
        wrong.append(f"the target's probe reads moe_intermediate_size {probed_intermediate}, HF's experts have {real}")
    if not shape_ok:
        why = ("; ".join(strict.shape_mismatch[:2]) or f"unmatched {unmatched[:4]}") if strict.checked_keys \
            else strict.note
        wrong.append(f"the converted experts do not load into Titan's (strict load {strict.verdict}: {why})")
    return [
        CompatIssue(
            code="experts_transposed",
            message=f"{type(experts).__name__}.gate_up_proj is (E, H, 2I) = {tuple(experts.gate_up_proj.shape)}; "
                    f"Titan expects (E, 2I, H), and {'; '.join(wrong)}",
            fix_location=f"{STATE_DICT_ADAPTER} (transpose in hf_to_titan_moe_state_dict and back in "
                         f"titan_to_hf_moe_state_dict) and {MOE_REPLACEMENT} (_probe_hf_moe_block: intermediate size)",
            severity="fixable",
        )
    ]


def _check_expert_bias(experts: Any) -> list[CompatIssue]:
    biases = [n for n in _own_state_names(experts, prefix="") if "bias" in n]
    if not biases:
        return []
    return [
        CompatIssue(
            code="expert_bias_unsupported",
            message=f"{type(experts).__name__} has per-expert biases {biases}; Titan's GroupedExperts has none",
            fix_location=f"{TITAN_MOE} (GroupedExperts), outside the experiment folder",
            severity="core",
        )
    ]


def _check_expert_activation(experts: Any, config: Any) -> list[CompatIssue]:
    act = read_field(config, "hidden_act") or read_field(config, "hidden_activation") or "silu"
    custom = [a for a in ("alpha", "limit") if hasattr(experts, a)]
    if str(act) in _SILU and not custom:
        return []
    what = f"clamped SwiGLU ({', '.join(custom)})" if custom else f"activation {act!r}"
    return [
        CompatIssue(
            code="expert_activation_unsupported",
            message=f"{type(experts).__name__} uses {what}; Titan's GroupedExperts hard-codes SiLU-gated experts",
            fix_location=f"{TITAN_MOE} (GroupedExperts activation), outside the experiment folder",
            severity="core",
        )
    ]


def _is_expert_weight_key(key: str) -> bool:
    """A routed expert weight on either side of the strict load (HF's experts.*_proj, Titan's inner experts)."""
    return ("experts." in key and not key.startswith("shared") and not key.endswith("bias")
            and ("_proj" in key or "inner_experts" in key))


def _has_router(module: Any) -> bool:
    return hasattr(module, "gate") or hasattr(module, "router")


def _own_state_names(module: Any, *, prefix: str, recurse: bool = False) -> list[str]:
    named = list(module.named_parameters(recurse=recurse)) + list(module.named_buffers(recurse=recurse))
    return [f"{prefix}.{n}" if prefix else n for n, _ in named]


def _class_source(cls: type) -> str:
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):
        return ""
