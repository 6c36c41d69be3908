"""Locate the MoE part of an HF causal-LM and build the target's Titan MoE for it.

Shared by the numerics, kernel-alignment and gap-analysis workers. Everything that
decides *how* Titan is built comes from the target checkout (``moe_replacement`` and
``state_dict_adapter`` of its transformers backend, imported lazily so the target's
copy is the one used); this module only finds the HF block and wires the pieces in the
order the skill prescribes (probe, build on meta, to_empty, init_states, adapter load).

Imported only inside worker subprocesses: it imports torch at module level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from phases.add_moe_model.work.hf_checks import probe_moe_site
from phases.add_moe_model.work.layout import target_attr

EXP = "torchtitan.experiments.transformers_modeling_backend"
# The target's own default (moe_replacement: getattr(config, "load_balance_coeff", 1e-3)).
TARGET_LOAD_BALANCE_COEFF = 1e-3


@dataclass(frozen=True, kw_only=True)
class MoeSite:
    """Where the first MoE lives in an HF model.

    Attributes:
        layer_index: index in ``model.model.layers``, e.g. 0.
        layer: the decoder layer.
        kind: "block" (``layer.mlp`` holds gate/router + experts) or "layer"
            (Gemma4 style: router and experts are siblings of a dense ``mlp``).
        block: the module holding router and experts (the layer itself for "layer").
        attr: the block's attribute ("mlp", "feed_forward", "block_sparse_moe"), "" for layer-level MoE.
    """

    layer_index: int
    layer: nn.Module
    kind: str
    block: nn.Module
    attr: str

    @property
    def router(self) -> nn.Module:
        return getattr(self.block, "gate", None) or self.block.router

    @property
    def experts(self) -> nn.Module:
        return self.block.experts

    @property
    def key_prefix(self) -> str:
        """Where the adapter meets the MoE's keys: the model's own path for a block, as in the probe's strict load.

        A layer-level MoE keeps ``mlp.``: its router and experts are converted as one block, without the dense mlp.
        """
        return f"model.layers.{self.layer_index}.{self.attr}." if self.kind == "block" else "mlp."


def find_moe_site(model: nn.Module) -> MoeSite | None:
    """The first MoE block or layer-level MoE of ``model``, found by the probe's own scan (any child
    with a router and experts: granitemoe's ``block_sparse_moe`` too), or None if none."""
    for index, layer in enumerate(model.model.layers):
        attr, block = probe_moe_site(layer)
        if attr == "<layer>":
            return MoeSite(layer_index=index, layer=layer, kind="layer", block=layer, attr="")
        if attr is not None:
            return MoeSite(layer_index=index, layer=layer, kind="block", block=block, attr=attr)
    return None


def build_config_from_entry(model_type: str, config_kwargs: dict[str, Any]):
    """Build an HF config from a ``_MODEL_CONFIGS``-style entry (no hub access)."""
    from transformers import AutoConfig

    kwargs = {k: v for k, v in config_kwargs.items() if k != "model_type"}
    return AutoConfig.for_model(model_type, **kwargs)


def set_experts_impl(config, *, model_cls, wanted: str = "grouped_mm") -> str:
    """Ask HF for ``wanted`` experts kernel when the model class allows it; return what runs.

    The skill allows exactly one adjustment here: skip the setting for models that
    reject a settable experts implementation. The answer is recorded, never hidden.
    """
    can_set = getattr(model_cls, "_can_set_experts_implementation", None)
    if can_set is not None and can_set():
        config._experts_implementation = wanted
        return wanted
    return "native"


def probe_moe_params(site: MoeSite, config) -> dict[str, Any]:
    """Run the target's own probe for this site (block or layer-level).

    Titan's MoE has its ``expert_bias_E`` buffer only with a load-balance coefficient. So the coefficient is
    kept exactly when the adapter converts some HF tensor into an ``expert_bias*`` key: judged on what the
    adapter produces, not on HF's name for the bias (``gate.e_score_correction_bias`` in DeepSeek/GLM, the
    block's ``expert_bias`` in afmoe). Without the buffer the bias is dropped as unexpected and Titan routes
    without it. The coefficient only steers training updates, never the forward.
    """
    has_bias = any(k.startswith("expert_bias") for k in convert_site_state_dict(site))
    config.load_balance_coeff = TARGET_LOAD_BALANCE_COEFF if has_bias else None
    config.comm_backend = "standard"
    if site.kind == "layer":
        return target_attr(f"{EXP}.moe_replacement", "_probe_layer_level_moe")(site.layer, config)
    return target_attr(f"{EXP}.moe_replacement", "_probe_hf_moe_block")(site.block, config)


def keys_of_target_build(params: dict[str, Any], config) -> set[str]:
    """State-dict keys of the MoE the target builds from ``params`` with its own default coefficient (on meta).

    That is the MoE the probe's strict load checks: a converted key it has and ours lacks is our worker's doing.
    """
    build = target_attr(f"{EXP}.moe_replacement", "_build_moe_config")
    with torch.device("meta"):
        moe = build({**params, "load_balance_coeff": TARGET_LOAD_BALANCE_COEFF}, config).build()
    return set(moe.state_dict())


def build_titan_moe(
    params: dict[str, Any], config, *, device: torch.device, dtype: torch.dtype = torch.float32
) -> nn.Module:
    """Build the target's Titan MoE from probed params: meta, to_empty, init_states.

    The meta module is cast to ``dtype`` before ``to_empty`` (free on meta) instead of
    casting after the load as the skill's script does: same values once the weights are
    loaded, without a transient fp32 copy of every expert (Mixtral's are 5.6 GB).
    """
    moe_config = target_attr(f"{EXP}.moe_replacement", "_build_moe_config")(params, config)
    with torch.device("meta"):
        moe = moe_config.build()
    moe.to(dtype)
    moe.to_empty(device=device)
    moe.init_states(buffer_device=device)
    return moe


def hf_site_state_dict(site: MoeSite) -> dict[str, torch.Tensor]:
    """HF state dict of the MoE part, keyed relative to the block (router/gate/experts/...)."""
    if site.kind == "block":
        return dict(site.block.state_dict())
    state: dict[str, torch.Tensor] = {}
    for name in ("router", "gate", "experts"):
        sub = getattr(site.layer, name, None)
        if sub is not None:
            state.update({f"{name}.{k}": v for k, v in sub.state_dict().items()})
    return state


def convert_site_state_dict(site: MoeSite) -> dict[str, torch.Tensor]:
    """The site's HF weights through the target's adapter, keyed relative to the block (Titan's names).

    The adapter sees the keys under the model's own path (``site.key_prefix``), as in the probe's
    strict load, so a pattern anchored on ``layers.N.mlp.`` converts here too.
    """
    target_attr(f"{EXP}.state_dict_adapter", "_TITAN_TO_ORIGINAL_HF_KEY").clear()
    prefix = site.key_prefix
    prefixed = {f"{prefix}{k}": v for k, v in hf_site_state_dict(site).items()}
    converted = target_attr(f"{EXP}.state_dict_adapter", "hf_to_titan_moe_state_dict")(prefixed)
    return {k.removeprefix(prefix): v for k, v in converted.items()}


def load_through_adapter(titan: nn.Module, site: MoeSite) -> dict[str, list[str]]:
    """Convert the HF weights with the target's adapter and load them (strict=False).

    The adapter is used as is: a converter bug must show up as missing/unexpected keys
    or as a numerical difference, so nothing here corrects its output.
    """
    result = titan.load_state_dict(convert_site_state_dict(site), strict=False)
    return {"missing": sorted(result.missing_keys), "unexpected": sorted(result.unexpected_keys)}


def measure_roundtrip(model: nn.Module) -> dict[str, Any]:
    """Whole-model HF -> Titan -> HF state-dict round trip through the target's adapter."""
    target_attr(f"{EXP}.state_dict_adapter", "_TITAN_TO_ORIGINAL_HF_KEY").clear()
    hf_sd = model.state_dict()
    to_titan = target_attr(f"{EXP}.state_dict_adapter", "hf_to_titan_moe_state_dict")
    back = target_attr(f"{EXP}.state_dict_adapter", "titan_to_hf_moe_state_dict")(to_titan(hf_sd))
    missing = sorted(set(hf_sd) - set(back))
    extra = sorted(set(back) - set(hf_sd))
    max_diff, shape_mismatch = 0.0, []
    for key in sorted(set(hf_sd) & set(back)):
        a, b = hf_sd[key], back[key]
        if a.shape != b.shape:
            shape_mismatch.append(f"{key}: {tuple(a.shape)} -> {tuple(b.shape)}")
        elif a.numel():
            max_diff = max(max_diff, max_abs_diff(a, b))
    return {"missing": missing, "extra": extra, "max_diff": max_diff, "shape_mismatch": shape_mismatch}


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| in fp32, one slice of the first dim at a time.

    Whole-tensor fp32 temporaries of Mixtral's fused experts (1.9 GB in bf16) took the worker
    to 16 GB and got it killed on a shared machine; equal tensors need no arithmetic at all.
    """
    if torch.equal(a, b):
        return 0.0
    if a.dim() < 2:
        return (a.float() - b.float()).abs().max().item()
    return max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b))
