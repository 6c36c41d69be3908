"""Phase 2 worker: build and validate the synthetic ``_MODEL_CONFIGS`` entry.

The entry follows the skill's rules (real hidden/intermediate/moe sizes, 8 experts, top-2
under the keys the config class reads, minimum layers with MoE forced onto layer 0, heads
that divide, small MLA/DSA dims, vocab 256, 64 positions, sdpa, no cache). It is then
proved, not trusted: ``check_synthetic_config`` re-checks every rule against the entry and
the instantiated config, and the model is built on meta to see that transformers accepts
it (e.g. sdpa) and that layer 0 really is an MoE layer.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from phases.add_moe_model.model_source import ModelSource
from phases.add_moe_model.work.config_fields import (
    EXPERT_COUNT_KEYS, TOP_K_KEYS, config_init_keys, expert_count, init_key, read_field, resolve_config_key,
)
from phases.add_moe_model.work.hf_config import build_hf_config
from phases.add_moe_model.work.scaled_config import DSA_DIMS, MLA_DIMS, ScalePlan, build_scaled_kwargs
from orchestrator.progress import report

FIXED = {"vocab_size": 256, "max_position_embeddings": 64, "attn_implementation": "sdpa", "use_cache": False}


class SyntheticRequest(BaseModel):
    source: ModelSource
    probe_min_layers: int | None = None
    """Phase 1's min_layers_needed for the real config (recorded, not reused: the entry forces MoE onto layer 0)."""


class SyntheticResponse(BaseModel):
    entry: dict[str, Any]
    checks: list[str]
    """Rule violations found by check_synthetic_config; empty when the entry is valid."""
    moe_layers_built: list[int]
    probe_min_layers: int | None


def build_synthetic(request: dict) -> dict:
    """Worker entry: SyntheticRequest dict in, SyntheticResponse dict out."""
    req = SyntheticRequest.model_validate(request)
    real = build_hf_config(req.source)
    entry, no_sdpa = fit_attention(build_synthetic_entry(real))
    report("validating the synthetic config", model_type=entry["model_type"])
    problems = [no_sdpa if no_sdpa and p.startswith("attn_implementation=") else p
                for p in check_synthetic_config(entry, real)]
    moe_layers, build_problems = probe_entry_build(entry)
    return SyntheticResponse(
        entry=entry, checks=problems + build_problems, moe_layers_built=moe_layers,
        probe_min_layers=req.probe_min_layers,
    ).model_dump(mode="json")


def build_synthetic_entry(real: Any) -> dict[str, Any]:
    """The skill's entry for ``real``: one layer unless the forced config still starts dense."""
    from transformers import AutoConfig

    from phases.add_moe_model.work.layers import predict_moe_layers

    entry = build_scaled_kwargs(real, ScalePlan(num_layers=1))
    # NOTE: the 8-layer copy is built by the same builder, so per-layer type lists match its length.
    eight = build_scaled_kwargs(real, ScalePlan(num_layers=8))
    layers = predict_moe_layers(AutoConfig.for_model(**eight))
    if not layers or layers[0] == 0:
        layers = built_moe_layers(eight) or layers  # the evidence wins over a mechanism layers.py lacks
    if layers and layers[0] > 0:
        entry = build_scaled_kwargs(real, ScalePlan(num_layers=layers[0] + 1))
    return entry


def fit_attention(entry: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The skill's sdpa, unless the model class has none: then eager, and the broken rule said ("" when kept).

    The entry is changed in the open: the rule stays broken until a person waives it, and the waiver
    then measures what the entry says (HF and Titan both on eager) instead of stopping again on sdpa.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        model_class = AutoModelForCausalLM._model_mapping[type(AutoConfig.for_model(**entry))]
    except (KeyError, ValueError, TypeError):
        return entry, ""  # the meta build says what is wrong with the entry itself
    if getattr(model_class, "_supports_sdpa", True):
        return entry, ""
    return {**entry, "attn_implementation": "eager"}, (
        f"attn_implementation: {model_class.__name__} has no sdpa path in transformers (_supports_sdpa is False), "
        "so the skill's attn_implementation='sdpa' cannot hold; the entry uses eager, which HF and Titan then both "
        "run: a person waives this rule to measure with eager, or aborts")


def check_synthetic_config(entry: dict[str, Any], real: Any) -> list[str]:
    """Return every rule of skill Phase 2 that ``entry`` breaks (empty list: valid)."""
    from transformers import AutoConfig

    problems = [f"{k}={entry.get(k)!r}, rule says {v!r}" for k, v in FIXED.items() if entry.get(k) != v]
    problems += _check_real_sizes(entry, real)
    try:
        built = AutoConfig.for_model(**entry)
    except (ValueError, TypeError, KeyError) as exc:
        return [*problems, f"AutoConfig.for_model rejects the entry: {exc}"]
    problems += _check_routing(entry, built)
    problems += _check_attention(entry, built, real)
    problems += _check_layer_forcing(entry, built, real)
    return problems


def _check_real_sizes(entry: dict[str, Any], real: Any) -> list[str]:
    out, keys = [], config_init_keys(real.model_type)
    for key in ("hidden_size", "intermediate_size", "moe_intermediate_size"):
        want, name = read_field(real, key), init_key(real, key, keys) or key
        if want is not None and entry.get(name) != want:
            out.append(f"{name}={entry.get(name)!r} but the real config has {want!r}")
    return out


def _check_routing(entry: dict[str, Any], built: Any) -> list[str]:
    keys = config_init_keys(entry["model_type"])
    out = []
    for candidates, want, what in ((EXPERT_COUNT_KEYS, 8, "expert count"), (TOP_K_KEYS, 2, "top-k")):
        key = resolve_config_key(keys, candidates)
        if key is None:
            out.append(f"{entry['model_type']} config reads none of {candidates} for the {what}")
        elif entry.get(key) != want or read_field(built, key) != want:
            out.append(f"{what}: {key}={entry.get(key)!r} (config reads {read_field(built, key)!r}), rule says {want}")
    groups = read_field(built, "n_group")
    experts = expert_count(built)
    if groups and experts and (experts % groups or experts // groups < 2):
        out.append(f"n_group={groups} does not split {experts} experts into groups of >= 2")
    return out


def _check_attention(entry: dict[str, Any], built: Any, real: Any) -> list[str]:
    heads, kv = built.num_attention_heads, read_field(built, "num_key_value_heads") or built.num_attention_heads
    out = []
    if built.hidden_size % heads:
        out.append(f"num_attention_heads={heads} does not divide hidden_size={built.hidden_size}")
    if heads % kv:
        out.append(f"num_key_value_heads={kv} does not divide num_attention_heads={heads}")
    if read_field(real, "kv_lora_rank") is not None:
        out += [f"MLA {k}={read_field(built, k)!r}, rule says {v}" for k, v in MLA_DIMS.items()
                if read_field(built, k) != v]
        if read_field(built, "q_lora_rank") not in (16, None):
            out.append(f"MLA q_lora_rank={read_field(built, 'q_lora_rank')!r}, rule says 16 (or None for full-rank Q)")
    if read_field(real, "index_topk") is not None:
        out += [f"DSA {k}={read_field(built, k)!r}, rule says {v}" for k, v in DSA_DIMS.items()
                if read_field(built, k) != v]
    return out


def _check_layer_forcing(entry: dict[str, Any], built: Any, real: Any) -> list[str]:
    out = []
    if read_field(real, "first_k_dense_replace") not in (None, 0) and read_field(built, "first_k_dense_replace") != 0:
        out.append("first_k_dense_replace must be 0 so layer 0 is MoE")
    if read_field(real, "decoder_sparse_step") is not None and read_field(built, "decoder_sparse_step") != 1:
        out.append("decoder_sparse_step must be 1")
    types = read_field(built, "mlp_layer_types")
    if read_field(real, "mlp_layer_types") is not None and (not types or any(t != "sparse" for t in types)):
        out.append(f"mlp_layer_types={types!r}, rule says ['sparse']")
    return out


def built_moe_layers(kwargs: dict[str, Any]) -> list[int]:
    """Indices of the MoE layers of ``kwargs``'s model built on meta (empty when it does not build)."""
    return probe_entry_build(kwargs)[0]


def probe_entry_build(entry: dict[str, Any]) -> tuple[list[int], list[str]]:
    """Build the entry's model on meta: transformers must accept it and layer N-1 must be MoE."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from phases.add_moe_model.work.hf_checks import probe_moe_site

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**entry))
    except (ValueError, TypeError, RuntimeError) as exc:
        return [], [f"transformers cannot build the entry on meta: {str(exc).splitlines()[0]}"]
    moe = [i for i, layer in enumerate(model.model.layers) if probe_moe_site(layer)[0] is not None]
    n = len(model.model.layers)
    if not moe:
        return moe, [f"no MoE layer among the entry's {n} layers"]
    if moe[0] + 1 != n:
        return moe, [f"the entry builds {n} layers but the first MoE layer is {moe[0]}: minimum is {moe[0] + 1}"]
    return moe, []
