"""The embedded target's harness: ``build_harness()`` for the local-compile-perf workflow.

Scale rule: ``LCP_SCALE=real|small`` when set; otherwise real DeepSeek-V3 dims when CUDA
is available and small dims on CPU (a CPU cannot step 7168-wide layers in CI time). The
scale is part of ``spec.name`` ("embedded:dsv3" or "embedded:dsv3-small"). ``LCP_EP``
overrides the EP degree one device stands for (default: the config's, 8 real / 2 small).

Layers: layer 0 is dense, the others are MoE, so the default two layers cover both kinds.
``build`` sets the trainer's fp32 matmul precision process-wide, as the trainer does, and
draws every weight and input in fp32 before casting, so one seed is one model in any dtype.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from torch import nn

from phases.kit.harness import HarnessSpec, fwd_bwd_step

from . import trainer_settings
from .block import Block, BlockKind
from .config import MoELayerConfig, Scale, dsv3_config
from .experts import ExpertBackend, resolve_expert_backend
from .local_compile import apply_local_compile, registered_regions
from .rope import build_rope_cache


class MoELayerWorkload:
    """Seeded layers plus their input ``x`` ``[tokens, dim]`` (a leaf requiring grad)."""

    def __init__(
        self, *, layers: nn.ModuleList, x: torch.Tensor, freqs_cis: torch.Tensor, backend: ExpertBackend
    ) -> None:
        self.layers = layers
        self.inputs = (x,)
        self.freqs_cis = freqs_cis
        self.expert_backend = backend

    def forward(self) -> torch.Tensor:
        h = self.inputs[0]
        for layer in self.layers:
            h = layer(h, self.freqs_cis)
        return h

    def step(self) -> torch.Tensor:
        return fwd_bwd_step(self)


def layer_kinds_for(num_layers: int) -> tuple[BlockKind, ...]:
    """Layer 0 dense, the rest MoE (one layer alone is MoE)."""
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    if num_layers == 1:
        return ("moe",)
    return ("dense",) + ("moe",) * (num_layers - 1)


class MoELayerHarness:
    def __init__(self, config: MoELayerConfig, *, scale: Scale) -> None:
        self.config = config
        suffix = "" if scale == "real" else f"-{scale}"
        self.spec = HarnessSpec(
            name=f"embedded:dsv3{suffix}",
            fp32_precision=trainer_settings.FP32_PRECISION,
            ac_mode=trainer_settings.AC_MODE,
            upstream_regions=tuple(trainer_settings.UPSTREAM_REGIONS),
            all_regions=registered_regions(),
            layer_kinds=tuple(dict.fromkeys(layer_kinds_for(2))),
        )

    def build(
        self, *, tokens: int, device: str, dtype: torch.dtype, seed: int, num_layers: int = 2
    ) -> MoELayerWorkload:
        dev = torch.device(device)
        torch.backends.cuda.matmul.fp32_precision = self.spec.fp32_precision
        backend = resolve_expert_backend(dev, dtype)
        torch.manual_seed(seed)
        # NOTE: drawn in fp32 and cast: seeded draws differ by dtype, and the bf16, fp32 and fp64
        # builds of one seed must be one model (correctness compares them).
        layers = nn.ModuleList(
            Block(self.config, kind=kind, backend=backend, device=dev, dtype=torch.float32)
            for kind in layer_kinds_for(num_layers)
        )
        cast_parameters(layers, dtype)
        x = torch.randn(tokens, self.config.dim, device=dev).to(dtype).requires_grad_()
        freqs = build_rope_cache(tokens, self.config.qk_rope_head_dim, theta=self.config.rope_theta, device=dev)
        return MoELayerWorkload(layers=layers, x=x, freqs_cis=freqs, backend=backend)

    def bind_regions(self, regions: Sequence[str]) -> None:
        apply_local_compile(list(regions))

    def compile_per_layer(self, workload: MoELayerWorkload) -> None:
        for layer in workload.layers:
            layer.compile()


def cast_parameters(module: nn.Module, dtype: torch.dtype) -> None:
    """Cast every parameter to ``dtype``; buffers keep theirs (the router's bias stays fp32)."""
    for sub in module.modules():
        for name, param in list(sub.named_parameters(recurse=False)):
            setattr(sub, name, nn.Parameter(param.detach().to(dtype)))


def resolve_scale(scale: str | None = None) -> Scale:
    """Explicit ``scale``, else ``LCP_SCALE``, else real on CUDA and small on CPU."""
    value = scale or os.environ.get("LCP_SCALE") or ("real" if torch.cuda.is_available() else "small")
    if value not in ("real", "small"):
        raise ValueError(f"LCP_SCALE={value!r}: choose 'real' or 'small'")
    return value  # type: ignore[return-value]


def build_harness(*, scale: str | None = None, ep_degree: int | None = None) -> MoELayerHarness:
    """Return the embedded DeepSeek-V3 layer harness (see the module docstring for scale)."""
    resolved = resolve_scale(scale)
    env_ep = os.environ.get("LCP_EP")
    ep = ep_degree if ep_degree is not None else (int(env_ep) if env_ep else None)
    return MoELayerHarness(dsv3_config(resolved, ep_degree=ep), scale=resolved)
