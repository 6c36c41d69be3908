"""Phase 2 worker: build and validate the synthetic ``_MODEL_CONFIGS`` entry.

The entry follows the skill's rules (real hidden/intermediate/moe sizes, 8 experts, top-2
under the keys the config class reads, heads that divide, small MLA/DSA dims, vocab 256, 64
positions, sdpa, no cache) with one exception the issue's first point makes: it holds one layer
of every kind of the real model's decoder layers (work/layer_plan.py), so a model with dense
layers ahead of its MoE layers keeps one of them ahead (first_k_dense_replace 1, not 0), and the
entry's layer note says why it has more than one layer. It is then proved, not trusted:
``check_synthetic_config`` re-checks every rule against the entry and the instantiated config,
the plan was built on meta and each of its layers described, and the entry is built on meta to
see that transformers accepts it (e.g. sdpa) and that it has an MoE layer.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from phases.add_moe_model.compat import LayerKind, PlannedLayer
from phases.add_moe_model.model_source import ModelSource
from phases.add_moe_model.work.config_fields import (
    EXPERT_COUNT_KEYS, TOP_K_KEYS, config_init_keys, expert_count, init_key, read_field, resolve_config_key,
)
from phases.add_moe_model.work.hf_config import build_hf_config
from phases.add_moe_model.work.layer_plan import LAYER_PLAN, LayerPlan, plan_layers
from phases.add_moe_model.work.scaled_config import DSA_DIMS, MLA_DIMS
from orchestrator.progress import report

FIXED = {"vocab_size": 256, "max_position_embeddings": 64, "attn_implementation": "sdpa", "use_cache": False}


class SyntheticRequest(BaseModel):
    source: ModelSource
    probe_min_layers: int | None = None
    """Phase 1's min_layers_needed for the real config (recorded, not reused: the entry holds one layer per kind)."""
    layer_kinds: list[LayerKind] = []
    """The probe's description of the real model's layers; empty: described here from a meta build of it."""


class SyntheticResponse(BaseModel):
    entry: dict[str, Any]
    checks: list[str]
    """Rule violations found by check_synthetic_config; empty when the entry is valid."""
    moe_layers_built: list[int]
    probe_min_layers: int | None
    layers: list[PlannedLayer] = []
    """Which kind of the real model each layer of the entry holds."""
    layer_note: str = ""
    """Why the entry has the layers it has (one per kind; more, and why; the kinds it lacks)."""


def build_synthetic(request: dict) -> dict:
    """Worker entry: SyntheticRequest dict in, SyntheticResponse dict out."""
    req = SyntheticRequest.model_validate(request)
    real = build_hf_config(req.source)
    kinds = req.layer_kinds or describe_real(real)
    plan = plan_layers(real, kinds, tiny=False)
    entry, no_sdpa = fit_attention(plan.kwargs)
    report("validating the synthetic config", model_type=entry["model_type"])
    mlp = {kind.name: kind.mlp for kind in kinds}
    dense = sum(1 for p in plan.layers if not mlp.get(p.kind, "moe").startswith("moe"))
    problems = [no_sdpa if no_sdpa and p.startswith("attn_implementation=") else p
                for p in check_synthetic_config(entry, real, dense=dense)]
    moe_layers, build_problems = probe_entry_build(entry)
    if moe_layers and len(plan.layers) - len(moe_layers) != dense:
        build_problems.append(f"the entry builds {len(plan.layers) - len(moe_layers)} layer(s) without MoE, the "
                              f"rule says {dense} (one per dense layer kind of the real model)")
    return SyntheticResponse(
        entry=entry, checks=problems + build_problems + missing_kinds(plan), moe_layers_built=moe_layers,
        probe_min_layers=req.probe_min_layers, layers=plan.layers, layer_note=plan.note,
    ).model_dump(mode="json")


def build_synthetic_entry(real: Any) -> dict[str, Any]:
    """The skill's entry for ``real``: one layer of each kind of its layers (described from a meta build)."""
    return plan_layers(real, describe_real(real), tiny=False).kwargs


def describe_real(real: Any) -> list[LayerKind]:
    """The real model's layer kinds, from its whole depth built on meta."""
    import torch
    from transformers import AutoModelForCausalLM

    from phases.add_moe_model.work.layer_kinds import describe_layers

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(real)
    return describe_layers(list(model.model.layers), real)


def missing_kinds(plan: LayerPlan) -> list[str]:
    """A kind the entry does not hold is a broken rule, the plan's note says which."""
    if not plan.missing:
        return []
    return [f"layer kinds: the entry holds no layer of {', '.join(repr(k) for k in plan.missing)}: {plan.note}; "
            f"the plan is this workflow's ({LAYER_PLAN})"]


def fit_attention(entry: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The skill's sdpa, unless the model class has none: then eager, and the broken rule said ("" when kept).

    The entry is changed in the open: the rule stays broken until a person waives it, and the waiver
    then measures what the entry says (HF and Titan both on eager) instead of stopping again on sdpa.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        model_class = AutoModelForCausalLM._model_mapping[type(AutoConfig.for_model(**entry))]
    except Exception:  # noqa: BLE001 - check_synthetic_config says what the config class refuses in the entry
        return entry, ""
    if getattr(model_class, "_supports_sdpa", True):
        return entry, ""
    return {**entry, "attn_implementation": "eager"}, (
        f"attn_implementation: {model_class.__name__} has no sdpa path in transformers (_supports_sdpa is False), "
        "so the skill's attn_implementation='sdpa' cannot hold; the entry uses eager, which HF and Titan then both "
        "run: a person waives this rule to measure with eager, or aborts")


def check_synthetic_config(entry: dict[str, Any], real: Any, *, dense: int = 0) -> list[str]:
    """Return every rule of skill Phase 2 that ``entry`` breaks (empty list: valid); ``dense``: the entry's
    layers that hold a dense layer kind of the real model (the one exception to "every layer MoE")."""
    from transformers import AutoConfig

    problems = [f"{k}={entry.get(k)!r}, rule says {v!r}" for k, v in FIXED.items() if entry.get(k) != v]
    problems += _check_real_sizes(entry, real)
    try:
        built = AutoConfig.for_model(**entry)
    except Exception as exc:  # noqa: BLE001 - the config class's own validation (e.g. huggingface_hub's strict dataclasses)
        return [*problems, f"AutoConfig.for_model rejects the entry: {exc}"]
    problems += _check_routing(entry, built)
    problems += _check_attention(entry, built, real)
    problems += _check_layer_forcing(built, real, dense=dense)
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


def _check_layer_forcing(built: Any, real: Any, *, dense: int) -> list[str]:
    out = []
    kept = f" (0, plus the {dense} layer(s) of dense kinds the entry holds ahead of its MoE layers)" if dense else ""
    first_k = read_field(built, "first_k_dense_replace")
    if read_field(real, "first_k_dense_replace") not in (None, 0) and first_k not in (0, dense):
        out.append(f"first_k_dense_replace={first_k!r}, the rule says {dense}{kept}")
    if read_field(real, "decoder_sparse_step") is not None and read_field(built, "decoder_sparse_step") != 1:
        out.append("decoder_sparse_step must be 1")
    return out


def probe_entry_build(entry: dict[str, Any]) -> tuple[list[int], list[str]]:
    """Build the entry's model on meta: transformers must accept it and it must have an MoE layer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from phases.add_moe_model.work.hf_checks import probe_moe_site

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**entry))
    except Exception as exc:  # noqa: BLE001 - transformers' refusal of the entry is a broken rule, said in full
        return [], [f"transformers cannot build the entry on meta: {' '.join(str(exc).split())[:300]}"]
    moe = [i for i, layer in enumerate(model.model.layers) if probe_moe_site(layer)[0] is not None]
    if not moe:
        return moe, [f"no MoE layer among the entry's {len(model.model.layers)} layers"]
    return moe, []
