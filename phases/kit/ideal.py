"""Ideal times from the bytes ops really move: eager traffic per op, boundary traffic per glue op.

``record_op_bytes`` runs a function in eager under a TorchDispatchMode and, for every aten
op that touches memory, adds up the bytes of its tensor arguments (read) and tensor results
(written); then it runs a backward under the same mode so the backward ops are recorded
apart (phase "bwd"). View ops move nothing and are skipped; a broadcast (stride-0) input is
counted by the elements it really holds. The per-op sum is the eager traffic; the glue op's
ideal is its boundary traffic (``boundary_bytes``): every input read once and every output
written once, and for the backward the output grads and saved inputs read and the input
grads written. ``ideal_ms`` turns bytes into time at a measured bandwidth.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Iterable

from phases.kit.records import OpBytes

if TYPE_CHECKING:
    import torch

_NO_TRAFFIC_PREFIXES = ("aten.empty", "aten.detach", "aten.lift_fresh")
"""Ops that allocate or alias without moving bytes (besides view ops, found by is_view)."""


def ideal_ms(nbytes: int | float, bandwidth_tbs: float) -> float:
    """Ideal ms of a memory-bound op moving ``nbytes`` at ``bandwidth_tbs`` TB/s."""
    if bandwidth_tbs <= 0:
        raise ValueError(f"ideal_ms: bandwidth must be positive, got {bandwidth_tbs} TB/s")
    return nbytes / (bandwidth_tbs * 1e12) * 1e3


def tensor_bytes(t: "torch.Tensor") -> int:
    """Bytes a kernel must touch for ``t``: dims with stride 0 (broadcast) count once."""
    held = math.prod(size for size, stride in zip(t.shape, t.stride()) if stride != 0)
    return int(held * t.element_size())


def _tensors(tree: Any) -> list["torch.Tensor"]:
    import torch
    from torch.utils._pytree import tree_leaves

    return [x for x in tree_leaves(tree) if isinstance(x, torch.Tensor)]


def _make_mode(records: list[OpBytes], phase: list[str]) -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class _OpBytesMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = str(func.overloadpacket.__name__)
            if not func.is_view and not str(func).startswith(_NO_TRAFFIC_PREFIXES):
                ins, outs = _tensors((args, kwargs)), _tensors(out)
                records.append(OpBytes(
                    op=f"aten.{name}",
                    phase=phase[0],
                    bytes_read=sum(tensor_bytes(t) for t in ins),
                    bytes_written=sum(tensor_bytes(t) for t in outs),
                    shapes=tuple(f"{tuple(t.shape)}:{str(t.dtype).removeprefix('torch.')}" for t in ins),
                ))
            return out

    return _OpBytesMode()


def record_op_bytes(fn: Callable[..., Any], *args: Any, backward: bool = True, seed: int = 0) -> list[OpBytes]:
    """Bytes read and written by every aten op of ``fn(*args)`` and of its backward.

    Args:
        fn: the glue function, run in eager.
        args: its inputs; those with requires_grad get grads in the backward pass.
        backward: also record the backward, driven by a seeded random output grad.
        seed: seed of the output grad.

    Returns:
        One OpBytes per op call, forward ops first (phase "fwd"), then backward ("bwd").
    """
    import torch

    records: list[OpBytes] = []
    phase = ["fwd"]
    with _make_mode(records, phase):
        out = fn(*args)
    outs = [t for t in _tensors(out) if t.requires_grad]
    if backward and outs:
        gen = torch.Generator(device=outs[0].device).manual_seed(seed)
        grads = [torch.randn(t.shape, generator=gen, device=t.device, dtype=t.dtype) for t in outs]
        phase[0] = "bwd"
        with _make_mode(records, phase):
            torch.autograd.backward(outs, grads)
    return records


def boundary_bytes(fn: Callable[..., Any], *args: Any) -> dict[str, int]:
    """Ideal traffic of ``fn`` fused into one kernel, fwd and bwd: {"fwd": n, "bwd": n}.

    fwd: inputs read once + outputs written once (an input that ``fn`` updates in place is
    written too). bwd: output grads read + inputs read (as saved) + input grads written, for
    the inputs that require grad.
    """
    ins = _tensors(args)
    versions = [t._version for t in ins]
    out = _tensors(fn(*args))
    updated = [t for t, version in zip(ins, versions) if t._version != version]
    grad_ins = [t for t in ins if t.requires_grad]
    written = {id(t): t for t in (*out, *updated)}  # NOTE: ``x.add_(1)`` returns x: one write
    fwd = sum(tensor_bytes(t) for t in ins) + sum(tensor_bytes(t) for t in written.values())
    bwd = 0
    if grad_ins and any(t.requires_grad for t in out):
        bwd = sum(tensor_bytes(t) for t in out if t.requires_grad) + sum(tensor_bytes(t) for t in ins)
        bwd += sum(tensor_bytes(t) for t in grad_ins)
    return {"fwd": fwd, "bwd": bwd}


def sum_bytes(ops: Iterable[OpBytes]) -> dict[str, int]:
    """Eager traffic per phase: {"fwd": bytes, "bwd": bytes}."""
    total = {"fwd": 0, "bwd": 0}
    for op in ops:
        total[op.phase] += op.bytes_moved
    return total
