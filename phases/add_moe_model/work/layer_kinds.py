"""The real model's decoder layers, described once: each distinct kind (attention x MLP) with its indices.

A kind is read from the layers the real config builds on meta at full depth, not predicted: the
sequence mixer's attribute, class and kind (``sharding_checks.resolve_attention_kind``), the MLP's
attribute, class and kind (MoE, layer-level MoE, dense, none), and the config's per-layer fields
(``layer_types``, ``mlp_layer_types``, ``no_rope_layers``, ...), so two layers of one class that the
config sets apart (sliding and full attention) are two kinds. Every later phase reports against this
description: the probe checks each kind with the target's code, the tiny twin and the synthetic entry
hold one layer of each (``representatives``), and the build check names the kind of a layer that fails.
"""

from __future__ import annotations

import re
from typing import Any

from phases.add_moe_model.compat import LayerKind, index_ranges
from phases.add_moe_model.work.hf_checks import probe_moe_site
from phases.add_moe_model.work.sharding_checks import resolve_attention_kind, sequence_mixer

# Per-layer config fields that hold layer indices, not one value per layer (Llama 4's moe_layers may be
# 48 long for 48 layers).
_INDEX_LISTS = frozenset({"moe_layers", "mlp_only_layers"})
_DENSE_NAME = re.compile(r"mlp|feed_forward|ffn", re.IGNORECASE)
# Config values naming a layer type whose mixer is not softmax attention.
_LINEAR_TYPES = ("linear", "mamba", "ssm", "delta", "recurrent")


def per_layer_fields(config: Any) -> dict[str, list[Any]]:
    """The config's per-layer fields: lists named for layers with one str or 0/1 value per decoder layer."""
    n = int(config.num_hidden_layers)
    found = {}
    for key, value in sorted(vars(config).items()):
        if "layer" not in key or key in _INDEX_LISTS or not isinstance(value, (list, tuple)) or len(value) != n:
            continue
        if all(isinstance(v, str) for v in value) or all(v in (0, 1) and not isinstance(v, float) for v in value):
            found[key] = list(value)
    return found


def describe_layers(layers: list[Any], config: Any) -> list[LayerKind]:
    """Group ``layers`` (the built decoder layers, index = position) into kinds, in order of first index."""
    fields = per_layer_fields(config)
    kinds: dict[tuple, dict[str, Any]] = {}
    for index, layer in enumerate(layers):
        values = {key: values[index] for key, values in fields.items() if index < len(values)}
        described = describe_layer(layer, values)
        key = (*described.values(), tuple(sorted(values.items())))
        kinds.setdefault(key, {**described, "config": values, "layers": []})["layers"].append(index)
    return name_kinds(list(kinds.values()))


def describe_layer(layer: Any, values: dict[str, Any]) -> dict[str, str]:
    """What one decoder layer is built from: its sequence mixer and its MLP."""
    mixer = sequence_mixer(layer)
    attention = resolve_attention_kind(mixer[1] if mixer else None)
    if attention in ("gqa", "custom") and any(m in str(values.get("layer_types", "")).lower() for m in _LINEAR_TYPES):
        attention = "linear"  # the config names the layer linear: q/k/v projections alone do not make attention
    attr, block = probe_moe_site(layer)
    if attr is not None:
        mlp, mlp_module = ("moe (layer-level)" if attr == "<layer>" else "moe"), _module_text(attr, block)
    else:
        mlp, mlp_module = dense_mlp(layer, skip=mixer[0] if mixer else None)
    return {"attention": attention, "attention_module": _module_text(*mixer) if mixer else "none",
            "mlp": mlp, "mlp_module": mlp_module}


def dense_mlp(layer: Any, *, skip: str | None) -> tuple[str, str]:
    """("dense", "mlp (Cls)") for the layer's dense feed-forward child, ("none", "none") without one."""
    for name, child in layer.named_children():
        if name == skip or child is None or "norm" in name.lower():
            continue
        if (_DENSE_NAME.search(name) or "MLP" in type(child).__name__) and any(True for _ in child.parameters()):
            return "dense", _module_text(name, child)
    return "none", "none"


def name_kinds(kinds: list[dict[str, Any]]) -> list[LayerKind]:
    """``attention (layer type) x mlp``; where two kinds would share a name, the values that set them apart."""
    for kind in kinds:
        layer_type = kind["config"].get("layer_types") or kind["config"].get("layers_block_type")
        attention = f"{kind['attention']} ({layer_type})" if layer_type and kind["attention"] != "none" \
            else kind["attention"]
        kind["name"] = f"{attention} x {kind['mlp']}"
    for name in {k["name"] for k in kinds}:
        group = [k for k in kinds if k["name"] == name]
        if len(group) < 2:
            continue
        keys = sorted({key for k in group for key in k["config"]})
        apart = [key for key in keys if len({str(k["config"].get(key)) for k in group}) > 1]
        modules = [m for m in ("mlp_module", "attention_module") if len({k[m] for k in group}) > 1]
        for kind in group:
            shown = [f"{key}={kind['config'].get(key)}" for key in apart] + [kind[m] for m in modules]
            kind["name"] += f" [{', '.join(shown)}]"
    return [LayerKind.model_validate(k) for k in kinds]


def representatives(kinds: list[LayerKind]) -> list[int]:
    """The first real layer of each kind, in layer order: what the tiny twin and the synthetic entry hold."""
    return sorted(kind.layers[0] for kind in kinds)


def kind_of(kinds: list[LayerKind]) -> dict[int, LayerKind]:
    return {index: kind for kind in kinds for index in kind.layers}


def layers_text(indices: list[int]) -> str:
    """"layer 5" or "layers 5, 11, 17"."""
    return f"layer{'s' if len(indices) > 1 else ''} {index_ranges(indices)}"


def _module_text(attr: str, module: Any) -> str:
    return f"{attr} ({type(module).__name__})"


def attention_summary(kinds: list[LayerKind]) -> tuple[str, list[str]]:
    """The report's attention kind ("hybrid" when the layers' kinds differ) and one line per mixer, with its layers."""
    mixers: dict[tuple[str, str], list[int]] = {}
    for kind in kinds:
        mixers.setdefault((kind.attention, kind.attention_module), []).extend(kind.layers)
    lines = [f"{layers_text(sorted(layers))}: {attention} at {module}" if module != "none"
             else f"{layers_text(sorted(layers))}: no attention or other sequence mixer"
             for (attention, module), layers in mixers.items()]
    distinct = sorted({kind.attention for kind in kinds} - {"none"})
    if not distinct:
        return "none", lines
    return (distinct[0] if len(distinct) == 1 else "hybrid"), lines
