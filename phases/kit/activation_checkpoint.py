"""Activation checkpointing around each layer, as a recipe sets it: "none", "full" or "selective".

"full" recomputes a layer's whole forward in its backward. "selective" is op-level selective checkpointing
(torch.utils.checkpoint's policy contexts): the outputs of the compute-bound ops (matmuls, grouped matmuls,
attention) are saved and everything else, the glue a region compiles, is recomputed. Each layer of a built
workload is wrapped in place, before a per-layer compile, in the order a trainer applies them.
"""

from __future__ import annotations

from typing import Any

AC_MODES = ("none", "full", "selective")
SAVED_OPS = ("mm", "addmm", "bmm", "baddbmm", "_grouped_mm", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
             "_scaled_dot_product_flash_attention_for_cpu")
"""aten ops whose outputs selective AC keeps (those present in this torch build)."""


def apply_activation_checkpointing(workload: Any, mode: str) -> None:
    """Wrap every layer of ``workload.layers`` for ``mode`` ("none" leaves them as they are)."""
    if mode not in AC_MODES:
        raise ValueError(f"AC mode {mode!r}: use one of {', '.join(AC_MODES)}")
    if mode == "none":
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    context_fn = selective_context if mode == "selective" else None
    for i, layer in enumerate(workload.layers):
        kwargs = {"context_fn": context_fn} if context_fn else {}
        workload.layers[i] = checkpoint_wrapper(layer, preserve_rng_state=False, **kwargs)


def saved_ops() -> set[Any]:
    import torch

    return {getattr(torch.ops.aten, name).default for name in SAVED_OPS if hasattr(torch.ops.aten, name)}


def selective_context() -> Any:
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    keep = saved_ops()

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        return CheckpointPolicy.MUST_SAVE if op in keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)
