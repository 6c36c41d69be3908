"""Best-known kernels for the embedded harness's glue ops, timed on each op's own arguments.

The skill's step 2 holds a glue op against the best kernel known for it, not only against its
ideal time. ``KERNELS`` maps a region to a kernel of a well-kept library (Liger-Kernel's Triton
kernels) through an adapter from the region's arguments to the kernel's call. Before a kernel
is timed, its outputs and input gradients are compared with the region's eager function on the
same arguments: a kernel that computes something else never stands as a best-known time. Where
no kernel can run (no CUDA device, the package missing, no kernel for the op) the reason is
recorded instead, so the findings say why the column is empty.
Worker side: imported by the glue worker (``work/glue.py``), torch inside the functions.
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

LIGER = "liger-kernel"
MATCH_RTOL = 2.0 ** -6
"""Largest |difference| from the region's eager outputs and input grads, relative to each tensor's largest |value|,
for a kernel to count as the same op: four bf16 ulps of the largest value (rounding order differs, the function not)."""


class BestKnown(BaseModel):
    """One glue op's best-known kernel: timed beside the region, or why it was not."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kernel: str = ""
    """The kernel's qualified name, e.g. "liger_kernel.ops.rms_norm.LigerRMSNormFunction"; "" when none."""
    source: str = ""
    """Package and version, e.g. "liger-kernel 0.8.5"."""
    fwdbwd_ms: tuple[float, ...] = ()
    """Per-call fwd+bwd samples (ms), timed like the region's; empty when not measured."""
    device_ms: float | None = None
    """Device time of the kernel's fwd+bwd per call (profiler), CUDA only."""
    max_abs_diff: float | None = None
    """Largest |difference| of outputs and input grads from the region's eager function."""
    max_rel_diff: float | None = None
    """The same, each tensor's difference over its largest |value| (the same-op check reads this one)."""
    note: str = ""
    """What differs from the region's call (layout, precision, extra work), read beside the time."""
    reason: str = ""
    """Why no time was taken; empty when measured."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Kernel:
    """How to run a library kernel on a region's arguments."""

    name: str
    package: str
    call: Callable[..., Any]
    """``call(*args, **kwargs)`` with the region's own arguments; returns the region's outputs."""
    note: str = ""


def _liger_rms_norm(x: Any, weight: Any, eps: float) -> Any:
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    return LigerRMSNormFunction.apply(x, weight, eps, 0.0, "gemma", False)


def _liger_swiglu(h13: Any) -> Any:
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    gate, up = h13.chunk(2, dim=-1)
    return LigerSiLUMulFunction.apply(gate, up)


def _liger_rope(x: Any, freqs_cis: Any) -> Any:
    from liger_kernel.ops.llama4_rope import LigerLlama4RopeFunction

    # NOTE: the kernel rotates q and k in place; a k sharing x's memory would be rotated twice.
    k = x.new_zeros((1, x.shape[0], 1, x.shape[-1]))
    q, _k = LigerLlama4RopeFunction.apply(x.unsqueeze(0), k, freqs_cis)
    return q.squeeze(0)


KERNELS: dict[str, Kernel] = {
    "rms_norm": Kernel(name="liger_kernel.ops.rms_norm.LigerRMSNormFunction", package=LIGER, call=_liger_rms_norm,
                       note="casting mode gemma (fp32 throughout, as the region)"),
    "swiglu": Kernel(name="liger_kernel.ops.swiglu.LigerSiLUMulFunction", package=LIGER, call=_liger_swiglu,
                     note="takes gate and up as two tensors: the packed [R, 2F] input is split and made contiguous "
                          "inside the timed call"),
    "rope": Kernel(name="liger_kernel.ops.llama4_rope.LigerLlama4RopeFunction", package=LIGER, call=_liger_rope,
                   note="complex (interleaved-pair) RoPE as the region; computes in the input dtype where the "
                        "region computes in fp32, and in place where the region returns a new tensor; Liger "
                        "rotates q and k in one call, so a one-head k of zeros rides along"),
}
NO_KERNEL = {
    "router": "no best-known kernel: Liger-Kernel has no group-limited top-k router (DeepSeek-V3's routing)",
}


def package_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def why_not_runnable(region: str, *, device: str) -> str:
    """Why the op's best-known kernel cannot be timed here ("" when it can)."""
    kernel = KERNELS.get(region)
    if kernel is None:
        return NO_KERNEL.get(region, f"no best-known kernel is known to the workflow for region {region!r}")
    if not device.startswith("cuda"):
        return f"{kernel.name} is a Triton kernel: it runs on CUDA only, and this run's device is {device}"
    if package_version(kernel.package) is None:
        return f"{kernel.package} is not installed on this machine (pip install {kernel.package})"
    return ""


def output_diffs(reference: Callable[..., Any], candidate: Callable[..., Any], args: tuple,
                 kwargs: dict[str, Any]) -> tuple[float, float]:
    """(absolute, relative) largest difference of outputs and input grads between two calls on fresh copies of
    the same arguments; relative is each tensor's largest |difference| over its reference's largest |value|."""
    import torch
    from torch.utils._pytree import tree_leaves

    def run(fn: Callable[..., Any]) -> list[Any]:
        fresh = [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                 for a in args]
        outs = [t for t in tree_leaves(fn(*fresh, **kwargs)) if isinstance(t, torch.Tensor)]
        grads_of = [t for t in outs if t.requires_grad]
        gen = torch.Generator(device=outs[0].device).manual_seed(0)
        if grads_of:
            torch.autograd.backward(grads_of, [torch.randn(t.shape, generator=gen, device=t.device, dtype=t.dtype)
                                               for t in grads_of])
        grads = [a.grad for a in fresh if isinstance(a, torch.Tensor) and a.grad is not None]
        return [t.detach().float() for t in (*outs, *grads)]

    pairs = [(a, b) for a, b in zip(run(reference), run(candidate), strict=True) if a.numel()]
    if not pairs:
        return 0.0, 0.0
    absolute = [float((a - b).abs().max()) for a, b in pairs]
    scale = [max(float(a.abs().max()), 1e-12) for a, _ in pairs]
    return max(absolute), max(d / m for d, m in zip(absolute, scale))


def measure_best_known(region: str, eager: Callable[..., Any], args: tuple, kwargs: dict[str, Any], *,
                       device: str, warmup: int, iters: int, grad_step: Callable[..., Any]) -> BestKnown:
    """Time ``region``'s best-known kernel on the region's recorded arguments, or say why not.

    ``grad_step(fn)`` builds the fwd+bwd closure the region itself is timed with, so both sides
    are timed the same way.
    """
    reason = why_not_runnable(region, device=device)
    if reason:
        return BestKnown(reason=reason)
    from phases.kit.profile import profile_kernels
    from phases.kit.timing import measure_step

    kernel = KERNELS[region]
    source = f"{kernel.package} {package_version(kernel.package)}"
    base = BestKnown(kernel=kernel.name, source=source, note=kernel.note)
    call = functools.partial(kernel.call, **kwargs)
    try:
        absolute, relative = output_diffs(eager, kernel.call, args, kwargs)
    except Exception as exc:  # a library kernel that refuses these shapes is a finding, not a crash of the op's row
        return base.model_copy(update={"reason": f"{kernel.name} raised on the op's arguments: "
                                                 f"{type(exc).__name__}: {exc}"})
    diffs = {"max_abs_diff": absolute, "max_rel_diff": relative}
    if relative > MATCH_RTOL:
        return base.model_copy(update={**diffs, "reason": f"{kernel.name} differs from the region by {absolute:.3g} "
                                       f"({relative:.2g} of the largest value > {MATCH_RTOL:.2g}): not the same op, "
                                       "so not a best-known time"})
    step = grad_step(lambda: call(*args)) or (lambda: call(*args))
    timing = measure_step(step, warmup=warmup, iters=iters, device=device)
    device_ms = profile_kernels(step, steps=iters, device=device).total_ms_per_step
    return base.model_copy(update={**diffs, "fwdbwd_ms": timing.samples_ms, "device_ms": device_ms})


def per_call_ms(best: dict[str, Any] | None, *, device_time: bool) -> float | None:
    """The kernel's fwd+bwd per call, by the same timer as the op it stands beside; None when not measured."""
    import statistics

    if not best or not best.get("fwdbwd_ms"):
        return None
    if device_time and best.get("device_ms") is not None:
        return best["device_ms"]
    return statistics.median(best["fwdbwd_ms"])


def describe(best: dict[str, Any] | None) -> str:
    """One cell of a report: the kernel and its source, or why there is no time."""
    if not best:
        return "not measured (no best-known data)"
    if best.get("reason"):
        return best["reason"]
    return (f"{best['kernel'].rsplit('.', 1)[-1]} ({best['source']}; max |diff| {best['max_abs_diff']:.2g}, "
            f"{best['max_rel_diff']:.2g} of the largest value)")
