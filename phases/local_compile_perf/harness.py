"""The harness contract: what a local-compile-perf baseline needs from a target.

A harness builds a small seeded workload (2 decoder layers at the target's dims, inputs
that require grad as in training) and switches it between the trees the skill compares:

    eager      bind_regions([])
    upstream   bind_regions(spec.upstream_regions)
    per_layer  bind_regions([]) then compile_per_layer(workload)
    candidate  a git branch of the target checked out, bind_regions(candidate regions)

Harnesses live in the target's world (they import torch and the target's code), so they
are loaded by reference inside a worker process: ``load_harness("pkg.mod:factory")``.
This module imports no torch; the engine may import it for ``HarnessSpec``.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    import torch

HF_PREFIX = "hf:"
"""``hf:<model_type>`` names a Hugging Face decoder-layer harness (work/hf_harness.py)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class HarnessSpec:
    """What a harness measures and under which trainer settings.

    Attributes:
        name: e.g. "embedded:dsv3-small" or "hf:qwen3_moe".
        fp32_precision: the trainer's ``torch.backends.cuda.matmul.fp32_precision``:
            "ieee" or "tf32".
        ac_mode: the recipe's activation checkpointing: "none", "full" or "selective".
        upstream_regions: regions the target enables today, e.g. ("router",).
        all_regions: every region name the target registers.
        layer_kinds: block types the harness's layers cover, e.g. ("dense", "moe").
    """

    name: str
    fp32_precision: str
    ac_mode: str
    upstream_regions: tuple[str, ...]
    all_regions: tuple[str, ...]
    layer_kinds: tuple[str, ...]


class HarnessSpecRecord(BaseModel):
    """``HarnessSpec`` as it crosses a process boundary (worker answers, events)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    fp32_precision: str
    ac_mode: str
    upstream_regions: tuple[str, ...]
    all_regions: tuple[str, ...]
    layer_kinds: tuple[str, ...]

    @classmethod
    def from_spec(cls, spec: HarnessSpec) -> "HarnessSpecRecord":
        return cls(**{name: getattr(spec, name) for name in HarnessSpec.__slots__})


class Workload(Protocol):
    """A built 2-layer workload; everything seeded, inputs are leaves with requires_grad."""

    layers: "torch.nn.ModuleList"
    inputs: tuple["torch.Tensor", ...]

    def step(self) -> "torch.Tensor":
        """One fwd+bwd: grads set to None, forward through all layers,
        ``loss = out.float().square().mean()``, ``loss.backward()``; returns the detached loss."""

    def forward(self) -> "torch.Tensor":
        """Forward only (run under ``torch.no_grad`` for the graph budget)."""


class Harness(Protocol):
    spec: HarnessSpec

    def build(
        self, *, tokens: int, device: str, dtype: "torch.dtype", seed: int, num_layers: int = 2
    ) -> Workload:
        """Build a seeded workload of ``num_layers`` layers on ``tokens`` packed tokens."""

    def bind_regions(self, regions: Sequence[str]) -> None:
        """Enable exactly ``regions`` process-wide ([] = eager); unknown name -> ValueError."""

    def compile_per_layer(self, workload: Workload) -> None:
        """Compile each layer (block) of ``workload`` with torch.compile: the per-layer baseline."""


def fwd_bwd_step(workload: Workload) -> "torch.Tensor":
    """The contract's training step: grads set to None, forward, ``out.float().square().mean()``,
    backward; returns the detached loss. Every harness's ``step`` is this."""
    for param in workload.layers.parameters():
        param.grad = None
    for tensor in workload.inputs:
        tensor.grad = None
    loss = workload.forward().float().square().mean()
    loss.backward()
    return loss.detach()


def load_harness(ref: str) -> Harness:
    """Return the harness named by ``ref``; call inside a worker (imports the target).

    Args:
        ref: ``"pkg.module:factory"`` (``factory()`` returns a Harness), or
            ``"hf:<model_type>"`` for the Hugging Face decoder-layer harness.

    Raises:
        ValueError: ``ref`` is malformed, or the factory's result lacks the Harness API.
    """
    if ref.startswith(HF_PREFIX):
        from phases.local_compile_perf.work.hf_harness import build_hf_harness

        return build_hf_harness(ref[len(HF_PREFIX):])
    module_name, sep, factory_name = ref.partition(":")
    if not sep or not module_name or not factory_name:
        raise ValueError(
            f"harness ref {ref!r} is not 'pkg.module:factory' or 'hf:<model_type>'; "
            "fix the workflow's harness option"
        )
    factory = getattr(importlib.import_module(module_name), factory_name, None)
    if factory is None:
        raise ValueError(f"harness ref {ref!r}: module {module_name} has no {factory_name!r}")
    harness = factory()
    missing = [a for a in ("spec", "build", "bind_regions", "compile_per_layer") if not hasattr(harness, a)]
    if missing:
        raise ValueError(f"harness ref {ref!r}: factory result lacks {missing} (see phases/local_compile_perf/harness.py)")
    return harness
