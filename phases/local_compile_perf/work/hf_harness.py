"""Harness for Hugging Face MoE decoder layers: ``hf:<model_type>``.

Two decoder layers of a transformers model at its published dims (from the kit's registry,
``phases/kit/registry.json``), built from the config class alone (nothing is
loaded from the hub). Layer ids are picked so the layers cover every block kind the
model has (dense and MoE), probed by building each candidate layer on the meta device.
Inputs are hidden states ``[1, T, H]`` requiring grad; RoPE ``(cos, sin)`` comes from the
model's own rotary class for positions 0..T-1, as the model computes it once per forward.

Trees: eager and per-layer compile only. These layers declare no regions
(``all_regions=()``), so ``bind_regions`` accepts only ``[]``.

Kernels: ``hf:<model_type>,attn=IMPL,experts=IMPL`` picks transformers' attention and
experts implementations (defaults ``sdpa`` and ``grouped_mm``, what a model built through
``from_config`` gets on a GPU); a non-default choice is part of ``spec.name``.

Scale: ``LCP_SCALE=real|small``; by default real dims on CUDA and small on CPU, where
``shrink_config`` keeps the structure and divides every width (spec.name gets "-small").
Parameters are re-initialized from the seed (transformers leaves expert weights as
``torch.empty`` and router weights at zero until ``post_init``).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from typing import Any

from phases.kit.harness import HarnessSpec, fwd_bwd_step
from phases.kit.registry import load_registry

SMALL_DIMS: dict[str, int] = {
    "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 64, "head_dim": 64,
    "num_attention_heads": 4, "num_experts": 8, "num_local_experts": 8, "n_routed_experts": 8,
    "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "q_lora_rank": 64, "kv_lora_rank": 32,
    "qk_rope_head_dim": 16, "qk_nope_head_dim": 32, "v_head_dim": 32, "vocab_size": 1024,
}
DEFAULT_KERNELS: dict[str, str] = {"attn": "sdpa", "experts": "grouped_mm"}
HF_FP32_PRECISION = "ieee"
"""transformers' Trainer leaves torch's default fp32 matmul precision (no TF32)."""


def read_registry_dims(model_type: str) -> dict[str, Any]:
    """Return the AutoConfig kwargs of ``model_type`` (or an alias) from the registry.

    Raises:
        ValueError: the model is not in the registry; the message lists known types.
    """
    table: dict[str, dict[str, Any]] = {}
    for entry in load_registry():
        for key in (entry.model_type, *entry.aliases):
            table.setdefault(key, entry.config)
    if model_type not in table:
        raise ValueError(f"hf:{model_type}: not in registry.json; known: {sorted(table)} (add it to the registry)")
    return dict(table[model_type])


def shrink_config(dims: dict[str, Any]) -> dict[str, Any]:
    """Same keys, CPU-sized values; query heads per KV head keep their ratio."""
    small = {k: (SMALL_DIMS[k] if k in SMALL_DIMS and isinstance(v, int) else v) for k, v in dims.items()}
    if "num_key_value_heads" in dims and "num_attention_heads" in dims:
        ratio = max(dims["num_attention_heads"] // max(dims["num_key_value_heads"], 1), 1)
        small["num_attention_heads"] = max(small["num_attention_heads"], ratio)
        small["num_key_value_heads"] = small["num_attention_heads"] // ratio
    return small


def resolve_modeling_classes(model_type: str) -> tuple[type, type]:
    """Return (DecoderLayer class, RotaryEmbedding class) from transformers' modeling module."""
    module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    found = {suffix: [getattr(module, n) for n in dir(module) if n.endswith(suffix)]
             for suffix in ("DecoderLayer", "RotaryEmbedding")}
    bad = {s: len(c) for s, c in found.items() if len(c) != 1}
    if bad:
        raise ValueError(f"hf:{model_type}: expected one class per suffix in {module.__name__}, found {bad}")
    return found["DecoderLayer"][0], found["RotaryEmbedding"][0]


def probe_layer_kind(layer: Any) -> str:
    """"moe" when the layer's MLP has experts, else "dense"."""
    mlp = getattr(layer, "mlp", None)
    return "moe" if mlp is not None and any("expert" in n for n, _ in mlp.named_modules()) else "dense"


class HFWorkload:
    def __init__(self, *, layers: Any, hidden: Any, position_embeddings: tuple[Any, Any], position_ids: Any) -> None:
        self.layers = layers
        self.inputs = (hidden,)
        self.position_embeddings = position_embeddings
        self.position_ids = position_ids

    def forward(self) -> Any:
        h = self.inputs[0]
        for layer in self.layers:
            out = layer(h, position_embeddings=self.position_embeddings, position_ids=self.position_ids)
            h = out[0] if isinstance(out, tuple) else out
        return h

    def step(self) -> Any:
        return fwd_bwd_step(self)


def parse_hf_ref(ref: str) -> tuple[str, dict[str, str]]:
    """``"qwen3_moe,attn=eager"`` -> ("qwen3_moe", {"attn": "eager", "experts": "grouped_mm"}).

    Raises:
        ValueError: an option other than attn/experts, or one without a value.
    """
    model_type, *options = ref.split(",")
    kernels = dict(DEFAULT_KERNELS)
    for option in options:
        key, sep, value = option.partition("=")
        if key not in kernels or not sep or not value:
            raise ValueError(f"hf:{ref}: option {option!r} is not attn=IMPL or experts=IMPL")
        kernels[key] = value
    return model_type, kernels


class HFDecoderHarness:
    def __init__(self, model_type: str, *, scale: str, kernels: dict[str, str] | None = None) -> None:
        import transformers

        dims = read_registry_dims(model_type)
        dims = shrink_config(dims) if scale == "small" else dims
        self.kernels = kernels or dict(DEFAULT_KERNELS)
        self.config = transformers.AutoConfig.for_model(model_type, **dims)
        # NOTE: set explicitly: a layer built from a bare config leaves both unset, and transformers
        # then falls back to eager attention and a per-expert loop (thousands of small kernels).
        self.config._attn_implementation = self.kernels["attn"]
        self.config._experts_implementation = self.kernels["experts"]
        self.layer_cls, self.rotary_cls = resolve_modeling_classes(self.config.model_type)
        self.layer_ids, kinds = self._pick_layer_ids()
        suffix = "" if scale == "real" else "-small"
        chosen = ",".join(f"{k}={v}" for k, v in self.kernels.items() if DEFAULT_KERNELS[k] != v)
        self.spec = HarnessSpec(
            name=f"hf:{self.config.model_type}{suffix}" + (f"[{chosen}]" if chosen else ""),
            fp32_precision=HF_FP32_PRECISION, ac_mode="none",
            upstream_regions=(), all_regions=(), layer_kinds=kinds,
        )

    def _pick_layer_ids(self) -> tuple[list[int], tuple[str, ...]]:
        """First layer of each kind (probed on meta); MoE layers fill up to two."""
        import torch

        by_kind: dict[str, list[int]] = {}
        for idx in range(self.config.num_hidden_layers):
            with torch.device("meta"):
                kind = probe_layer_kind(self.layer_cls(self.config, idx))
            by_kind.setdefault(kind, []).append(idx)
            if "moe" in by_kind and len(by_kind["moe"]) >= 2:
                break
        ids = [by_kind["dense"][0]] if "dense" in by_kind else []
        ids += by_kind.get("moe", [])
        return sorted(ids), tuple(k for k in ("dense", "moe") if k in by_kind)

    def build(self, *, tokens: int, device: str, dtype: Any, seed: int, num_layers: int = 2) -> HFWorkload:
        import torch

        torch.backends.cuda.matmul.fp32_precision = self.spec.fp32_precision
        torch.manual_seed(seed)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device(device):
                layers = torch.nn.ModuleList(self.layer_cls(self.config, i) for i in self.layer_ids[:num_layers])
                torch.manual_seed(seed)  # NOTE: constructors draw a dtype-dependent amount; init draws anew
                init_parameters(layers, std=self.config.initializer_range)
                hidden = torch.randn(1, tokens, self.config.hidden_size, dtype=torch.float32).to(dtype)
                hidden.requires_grad_()
                position_ids = torch.arange(tokens).unsqueeze(0)
                cos, sin = self.rotary_cls(self.config)(hidden, position_ids)
        finally:
            torch.set_default_dtype(previous)
        return HFWorkload(layers=layers, hidden=hidden, position_embeddings=(cos, sin), position_ids=position_ids)

    def bind_regions(self, regions: Sequence[str]) -> None:
        if list(regions):
            raise ValueError(f"{self.spec.name} declares no compile regions; got {list(regions)}, known: []")

    def compile_per_layer(self, workload: HFWorkload) -> None:
        for layer in workload.layers:
            layer.compile()


def init_parameters(layers: Any, *, std: float) -> None:
    """Seeded init: matrices ~ N(0, std) drawn in fp32 (so any dtype gets one model), norm weights 1,
    other vectors 0."""
    import torch

    with torch.no_grad():
        for name, p in layers.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.empty(p.shape, dtype=torch.float32, device=p.device).normal_(0.0, std))
            else:
                p.fill_(1.0 if "norm" in name else 0.0)


def build_hf_harness(ref: str, *, scale: str | None = None) -> HFDecoderHarness:
    """Return the ``hf:<model_type>[,attn=IMPL][,experts=IMPL]`` harness (``ref`` without ``hf:``)."""
    import torch

    model_type, kernels = parse_hf_ref(ref)
    value = scale or os.environ.get("LCP_SCALE") or ("real" if torch.cuda.is_available() else "small")
    if value not in ("real", "small"):
        raise ValueError(f"LCP_SCALE={value!r}: choose 'real' or 'small'")
    return HFDecoderHarness(model_type, scale=value, kernels=kernels)
