"""The harness contract: what a measurement of the kit needs from a target.

A harness builds a small seeded workload (2 decoder layers at the target's dims, inputs
that require grad as in training) and switches it between the trees the kit compares:

    eager      bind_regions([])
    upstream   bind_regions(spec.upstream_regions)
    per_layer  bind_regions([]) then compile_per_layer(workload)
    regions:a,b  bind_regions(["a", "b"]) (a candidate, in its own checkout)

Harnesses live in the target's world (they import torch and the target's code), so they
are loaded by reference inside a worker process: ``load_harness("pkg.mod:factory")``, or
``"pkg.mod:factory:ARG"`` for a factory that takes one string. Every worker request is a
``HarnessRequest``; the timed ones carry ``TimingKnobs``. This module is a leaf of the kit:
it imports no workflow and no torch at import time.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    import torch

DTYPES = {"bf16": "bfloat16", "fp32": "float32", "fp64": "float64"}
TREE_FORMS = "eager | upstream | per_layer | regions:NAME[,NAME...]"


class HarnessSpec(BaseModel):
    """What a harness measures and under which trainer settings (it crosses process boundaries)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    """E.g. "embedded:dsv3-small" or "hf:qwen3_moe"."""
    fp32_precision: str
    """The trainer's ``torch.backends.cuda.matmul.fp32_precision``: "ieee" or "tf32"."""
    ac_mode: str
    """The recipe's activation checkpointing: "none", "full" or "selective"."""
    upstream_regions: tuple[str, ...]
    """Regions the target enables today, e.g. ("router",)."""
    all_regions: tuple[str, ...]
    """Every region name the target registers."""
    layer_kinds: tuple[str, ...]
    """Block types the harness's layers cover, e.g. ("dense", "moe")."""


class HarnessRequest(BaseModel):
    """What every worker that loads a harness is asked: which harness, where, which seed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    harness: str
    """Harness ref, e.g. "examples.moe_layer.harness:build_harness"."""
    device: str
    """"cpu", "cuda" or "cuda:N" (resolved by the caller; never "auto")."""
    seed: int = 0


class TimingKnobs(BaseModel):
    """How long a timed measurement runs: the skill's 5 warm-up, 20 timed and 5 profiled steps."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    warmup: int = Field(default=5, ge=1)
    iters: int = Field(default=20, ge=1)
    profile_steps: int = Field(default=5, ge=1)


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
        ref: ``"pkg.module:factory"`` (``factory()`` returns a Harness) or
            ``"pkg.module:factory:ARG"`` (``factory(ARG)``).

    Raises:
        ValueError: ``ref`` is malformed, or the factory's result lacks the Harness API.
    """
    module_name, sep, rest = ref.partition(":")
    factory_name, _, argument = rest.partition(":")
    if not sep or not module_name or not factory_name:
        raise ValueError(f"harness ref {ref!r} is not 'pkg.module:factory[:ARG]'; fix the workflow's harness option")
    factory = getattr(importlib.import_module(module_name), factory_name, None)
    if factory is None:
        raise ValueError(f"harness ref {ref!r}: module {module_name} has no {factory_name!r}")
    harness = factory(argument) if argument else factory()
    missing = [a for a in ("spec", "build", "bind_regions", "compile_per_layer") if not hasattr(harness, a)]
    if missing:
        raise ValueError(f"harness ref {ref!r}: factory result lacks {missing} (see phases/kit/harness.py)")
    return harness


def resolve_tree(spec: HarnessSpec, tree: str) -> tuple[tuple[str, ...], bool]:
    """(regions to bind, compile per layer) for a tree name; unknown regions are left to bind_regions."""
    if tree == "eager":
        return (), False
    if tree == "upstream":
        return tuple(spec.upstream_regions), False
    if tree == "per_layer":
        return (), True
    if tree.startswith("regions:"):
        return tuple(r for r in tree.removeprefix("regions:").split(",") if r), False
    raise ValueError(f"unknown tree {tree!r}; use {TREE_FORMS}")


def resolve_dtype(name: str) -> "torch.dtype":
    import torch

    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)}")
    return getattr(torch, DTYPES[name])


def build_tree_workload(
    harness: Harness, tree: str, *, tokens: int, device: str, dtype: "torch.dtype", seed: int, num_layers: int = 2,
    ac_mode: str = "none",
) -> Workload:
    """Bind the tree's regions (process-wide), build the workload, wrap its layers for ``ac_mode``, compile per
    block if asked (after the wrapping, as a trainer does)."""
    from phases.kit.activation_checkpoint import apply_activation_checkpointing

    regions, per_layer = resolve_tree(harness.spec, tree)
    harness.bind_regions(list(regions))
    workload = harness.build(tokens=tokens, device=device, dtype=dtype, seed=seed, num_layers=num_layers)
    apply_activation_checkpointing(workload, ac_mode)
    if per_layer:
        harness.compile_per_layer(workload)
    return workload


def set_fp32_precision(precision: str) -> None:
    """Match the trainer's fp32 matmul precision ("ieee" | "tf32")."""
    import torch

    torch.backends.cuda.matmul.fp32_precision = precision
