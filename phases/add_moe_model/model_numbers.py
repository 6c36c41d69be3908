"""The model's numbers twice, each from its record: the synthetic entry numerics measured, and the real model.

The synthetic entry keeps the real hidden and MoE sizes but 8 experts, top-2 and as few layers as the
kinds of layer need; the real model (the probe's reading of the config the run was given) may have 512
experts, top-10 and 48 layers. The documents give both, each labelled with where it was read, so no
reader takes the scaled numbers for the model's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from phases.add_moe_model.cited import Cited
from phases.add_moe_model.records import Results
from phases.add_moe_model.work.config_fields import EXPERT_COUNT_KEYS, TOP_K_KEYS

LAYER_KEYS = ("num_hidden_layers", "num_layers")


@dataclass(frozen=True)
class Numbers:
    """One model's dimensions as a record holds them (None: the record does not say)."""

    label: str
    """What they are and where they were read, e.g. "synthetic entry (synthetic_config, seq 18)"."""
    hidden: int | None
    moe_intermediate: int | None
    experts: int | None
    top_k: int | None
    layers: int | None

    def short(self) -> str:
        """"H=2048, I=768, E=128, top-8, 48 layers" (a value no record holds reads "?", and the text says so)."""
        values = (self.hidden, self.moe_intermediate, self.experts, self.top_k, self.layers)
        return (f"H={_n(self.hidden)}, I={_n(self.moe_intermediate)}, E={_n(self.experts)}, top-{_n(self.top_k)}, "
                f"{_n(self.layers)} layer{'' if self.layers == 1 else 's'}"
                + (" (?: the record does not hold it)" if None in values else ""))

    def routing(self) -> str:
        """"top-2 of 8 experts"."""
        return f"top-{_n(self.top_k)} of {_n(self.experts)} experts"

    def as_data(self) -> dict[str, Any]:
        return {"label": self.label, "hidden": self.hidden, "moe_intermediate": self.moe_intermediate,
                "experts": self.experts, "top_k": self.top_k, "layers": self.layers,
                "short": self.short(), "routing": self.routing()}


def synthetic_numbers(results: Results, cited: Cited) -> Numbers:
    """The synthetic entry, as numerics built its MoE (``moe_params`` of the bf16 verdict) where it recorded
    one, else as the entry sets it; the layer count is the entry's."""
    entry = results.synthetic_config.entry if results.synthetic_config else {}
    measured = (results.numerics.verdict.model_extra or {}).get("moe_params") if results.numerics else None
    measured = measured if isinstance(measured, dict) else {}
    label = f"synthetic entry ({cited.phase('synthetic_config')})"
    if measured:
        label = f"synthetic entry ({cited.phase('synthetic_config')}; its MoE as numerics built it, " \
                f"{cited.phase('numerics')})"
    return Numbers(label=label, hidden=measured.get("dim", entry.get("hidden_size")),
                   moe_intermediate=measured.get("moe_intermediate_size", entry.get("moe_intermediate_size")),
                   experts=measured.get("num_experts", _first(entry, EXPERT_COUNT_KEYS)),
                   top_k=measured.get("top_k", _first(entry, TOP_K_KEYS)), layers=_first(entry, LAYER_KEYS))


def real_numbers(results: Results, options: dict[str, Any], cited: Cited) -> Numbers | None:
    """The real model as the probe read its config (None without a probe result)."""
    probe = results.probe
    if probe is None:
        return None
    fields = {**(probe.model_extra or {}), **probe.model_dump(include={"hidden_size", "moe_intermediate_size"})}
    return Numbers(label=f"real model ({config_origin(options)}; {cited.phase('probe')})",
                   hidden=fields.get("hidden_size"), moe_intermediate=fields.get("moe_intermediate_size"),
                   experts=fields.get("num_experts"), top_k=fields.get("top_k"), layers=fields.get("num_hidden_layers"))


def config_origin(options: dict[str, Any]) -> str:
    """Which config the probe read, in words: a published one, a file, or a config class's defaults."""
    model_id = str(options.get("model_id") or options.get("model") or "")
    kind = options.get("model_source") or _kind_of(model_id)
    if kind == "model_type":
        return f"the {model_id.removeprefix('type:')} config class's defaults, not a published model"
    if kind == "config_file":
        return f"the config.json given as --model, named {options.get('model_name') or model_id}"
    if kind == "registry":
        return f"{model_id}'s published config, bundled registry"
    return f"{model_id}'s config"


def _kind_of(model_id: str) -> str:
    """The source kind of a run from before start recorded it."""
    from phases.kit.registry import find_registry_entry

    if model_id.startswith("type:"):
        return "model_type"
    if model_id.startswith("/"):
        return "config_file"
    return "registry" if find_registry_entry(model_id) else "hub"


def _first(entry: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    return next((int(entry[k]) for k in keys if isinstance(entry.get(k), int)), None)


def _n(value: int | None) -> str:
    return "?" if value is None else str(value)
