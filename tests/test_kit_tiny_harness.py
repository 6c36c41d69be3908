"""A tiny two-block harness with two named regions, for fast kit tests on CPU.

It follows phases/kit/harness.py: regions bind process-wide, unknown names
raise, inputs are seeded leaves with requires_grad. Regions compile with the aot_eager
backend so Dynamo graphs are real (and countable) without Inductor's C++ build on a
2-core host. ``build_harness`` is the factory ref "tests.test_kit_tiny_harness:build_harness".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import pytest
import torch
from torch import nn

from phases.kit.harness import HarnessSpec, fwd_bwd_step, load_harness

DIM = 32


def _rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    xf = x.to(torch.promote_types(x.dtype, torch.float32))  # fp64 stays fp64
    return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * weight


def _swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return nn.functional.silu(gate) * up


REGIONS: dict[str, Callable[..., torch.Tensor]] = {"rms_norm": _rms_norm, "swiglu": _swiglu}
_BOUND: dict[str, Callable[..., torch.Tensor]] = {}


def call_region(name: str, *args: torch.Tensor) -> torch.Tensor:
    return _BOUND.get(name, REGIONS[name])(*args)


class TinyBlock(nn.Module):
    def __init__(self, *, device: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.norm_weight = nn.Parameter(torch.ones(DIM, device=device, dtype=dtype))
        self.w13 = nn.Linear(DIM, 4 * DIM, bias=False, device=device, dtype=dtype)
        self.w2 = nn.Linear(2 * DIM, DIM, bias=False, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = call_region("rms_norm", x, self.norm_weight)
        return x + self.w2(call_region("swiglu", self.w13(h)))


@dataclass(kw_only=True)
class TinyWorkload:
    layers: nn.ModuleList
    inputs: tuple[torch.Tensor, ...]

    def forward(self) -> torch.Tensor:
        x = self.inputs[0]
        for layer in self.layers:
            x = layer(x)
        return x

    def step(self) -> torch.Tensor:
        return fwd_bwd_step(self)


class TinyHarness:
    spec = HarnessSpec(name="tiny", fp32_precision="ieee", ac_mode="none", upstream_regions=("rms_norm",),
                       all_regions=tuple(REGIONS), layer_kinds=("dense",))
    region_functions = REGIONS

    def build(self, *, tokens: int, device: str, dtype: torch.dtype, seed: int, num_layers: int = 2) -> TinyWorkload:
        torch.manual_seed(seed)
        layers = nn.ModuleList([TinyBlock(device="cpu", dtype=torch.float32) for _ in range(num_layers)])
        x = torch.randn(tokens, DIM)
        return TinyWorkload(layers=layers.to(device=device, dtype=dtype),
                            inputs=(x.to(device=device, dtype=dtype).requires_grad_(True),))

    def bind_regions(self, regions: Sequence[str]) -> None:
        unknown = sorted(set(regions) - set(REGIONS))
        if unknown:
            raise ValueError(f"unknown regions {unknown}; known: {sorted(REGIONS)}")
        _BOUND.clear()
        _BOUND.update({n: torch.compile(REGIONS[n], fullgraph=True, dynamic=False, backend="aot_eager") for n in regions})

    def compile_per_layer(self, workload: TinyWorkload) -> None:
        for layer in workload.layers:
            layer.compile(backend="aot_eager", dynamic=False)


def build_harness() -> TinyHarness:
    return TinyHarness()


def test_tiny_harness_loads_by_ref_and_rejects_unknown_region():
    harness = load_harness("tests.test_kit_tiny_harness:build_harness")
    with pytest.raises(ValueError, match="known: \\['rms_norm', 'swiglu'\\]"):
        harness.bind_regions(["nope"])
    wl = harness.build(tokens=8, device="cpu", dtype=torch.float32, seed=0)
    assert wl.step().ndim == 0 and wl.inputs[0].grad is not None
