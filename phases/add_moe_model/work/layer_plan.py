"""A scaled config that holds one layer of every kind of the real model (worker side).

The synthetic entry (real sizes) and the probe's tiny twin (every size shrunk) come from the same plan:
the first real layer of each kind, in layer order, each with its per-layer config values, and the MoE
mechanism rewritten so that exactly the layers of MoE kinds are MoE. Where the config cannot say that
(jamba's expert and attention periods), the plan keeps the real model's first layers up to the last kind's
first layer and the config's own mechanism: more layers than one per kind, and said so. Each candidate is
built on meta and described like the real model (work/layer_kinds.py), so which kind each scaled layer
holds is read from the built layers; a kind that no candidate holds is named, never dropped in silence.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from phases.add_moe_model.compat import LayerKind, PlannedLayer
from phases.add_moe_model.work.layer_kinds import describe_layers, kind_of, representatives
from phases.add_moe_model.work.scaled_config import ScalePlan, build_scaled_kwargs

LAYER_PLAN = "phases/add_moe_model/work/layer_plan.py"


class LayerPlan(BaseModel):
    kwargs: dict[str, Any]
    """``AutoConfig.for_model`` kwargs of the scaled config."""
    layers: list[PlannedLayer]
    missing: list[str]
    """Kinds of the real model that no layer of the scaled config holds."""
    prefix: bool
    """The plan keeps the real first layers (the config could not place one layer per kind)."""
    note: str
    """Why the scaled config has the layers it has."""


def plan_layers(real: Any, kinds: list[LayerKind], *, tiny: bool) -> LayerPlan:
    """The first candidate that holds every kind (one layer each, else the real prefix); the last one tried
    when neither does, with the kinds it lacks."""
    reps = representatives(kinds)
    dense = tuple(j for j, i in enumerate(reps) if not kind_of(kinds)[i].mlp.startswith("moe"))
    prefix = tuple(range(max(reps) + 1))
    prefix_dense = tuple(i for i in prefix if not kind_of(kinds)[i].mlp.startswith("moe"))
    candidates = [ScalePlan(layers=tuple(reps), dense=dense, tiny=tiny)]
    if len(prefix) > len(reps):
        candidates.append(ScalePlan(layers=prefix, dense=prefix_dense, prefix=True, tiny=tiny))
    plan = None
    for scale in candidates:
        plan = check_plan(real, kinds, scale)
        if not plan.missing:
            break
    return plan


def check_plan(real: Any, kinds: list[LayerKind], scale: ScalePlan) -> LayerPlan:
    """Build ``scale``'s config on meta and read which real kind each of its layers holds."""
    kwargs = build_scaled_kwargs(real, scale)
    built = describe_built(kwargs)
    wanted = {signature(k): k.name for k in kinds}
    at = {index: wanted.get(signature(kind)) for kind in built for index in kind.layers}
    layers = [PlannedLayer(layer=j, real_layer=i, kind=at.get(j)) for j, i in enumerate(scale.positions)]
    missing = [k.name for k in kinds if k.name not in {p.kind for p in layers}]
    return LayerPlan(kwargs=kwargs, layers=layers, missing=missing, prefix=scale.prefix,
                     note=plan_note(kinds, layers, prefix=scale.prefix, missing=missing))


def describe_built(kwargs: dict[str, Any]) -> list[LayerKind]:
    """The kinds of the model ``kwargs`` builds on meta (none when transformers refuses it); with eager attention,
    which every class has (the entry's own checks say whether it takes sdpa)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.for_model(**{**kwargs, "attn_implementation": "eager"})
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception:  # noqa: BLE001 - a candidate transformers refuses holds no kind; the entry's checks say why
        return []
    return describe_layers(list(model.model.layers), config)


def signature(kind: LayerKind) -> tuple:
    """What makes two layers one kind, without their indices."""
    return kind.attention, kind.attention_module, kind.mlp, kind.mlp_module, tuple(sorted(kind.config.items()))


def plan_note(kinds: list[LayerKind], layers: list[PlannedLayer], *, prefix: bool, missing: list[str]) -> str:
    held = "; ".join(f"layer {p.layer}: {p.kind} (real layer {p.real_layer})" for p in layers if p.kind)
    if missing:
        return f"{len(layers)} layer(s) hold {len(kinds) - len(missing)} of the real model's {len(kinds)} layer " \
               f"kinds ({held}); not held: {', '.join(missing)}"
    if prefix:
        return (f"{len(layers)} layers, more than one per kind: the config places its layer kinds by a rule this "
                f"plan cannot rewrite, so it keeps the real model's first {len(layers)} layers, which hold each of "
                f"its {len(kinds)} kinds ({held})")
    if len(layers) == 1:
        return f"1 layer: the real model has one layer kind ({held})"
    return f"{len(layers)} layers, not the minimum 1: one of each of the real model's {len(kinds)} layer kinds ({held})"
