"""Which dtype each matmul of a forward really ran in, per module: the test of "fp32 on both sides".

A comparison run "in fp32" is fp32 only where every matmul saw fp32 inputs: torchtitan's ``GroupedExperts``
casts its inputs and weights to bf16 whatever the run's dtype, and ``torch.autocast(dtype=float32)`` around a
gate is inactive on CPU. ``matmuls_below`` runs one forward under a ``TorchDispatchMode`` that sees every aten
op as it executes (after autocast and every cast the code makes) and lists the matmuls whose floating inputs
carried fewer bits than the run's dtype, with the module that called them. Torch is imported inside the
functions; the engine may import this module for nothing but its names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

MATMUL_OPS = frozenset({"mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "linear", "_grouped_mm",
                        "_scaled_mm", "_scaled_grouped_mm"})


def matmuls_below(root: Any, run: Callable[[], Any], *, dtype: Any) -> list[dict[str, Any]]:
    """[{"module", "op", "dtypes", "calls"}] of the matmuls ``run()`` executed under ``root`` with an input of
    fewer bits than ``dtype`` (a float dtype); [] when every one ran at least in ``dtype``."""
    seen = record_matmul_dtypes(root, run)
    width = _bits(dtype)
    return [row for row in seen if any(_bits(_dtype(name)) < width for name in row["dtypes"])]


def record_matmul_dtypes(root: Any, run: Callable[[], Any]) -> list[dict[str, Any]]:
    """Every matmul ``run()`` executed inside ``root``'s modules: module path, aten op, input dtypes, calls."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    stack: list[str] = []
    found: dict[tuple[str, str], dict[str, Any]] = {}

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name in MATMUL_OPS and stack:
                dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in tree_leaves((args, kwargs or {}))
                                 if isinstance(t, torch.Tensor) and t.is_floating_point()})
                row = found.setdefault((stack[-1], name), {"module": stack[-1], "op": name, "dtypes": [], "calls": 0})
                row["dtypes"] = sorted(set(row["dtypes"]) | set(dtypes))
                row["calls"] += 1
            return func(*args, **(kwargs or {}))

    def leave(*_args: Any) -> None:  # a forward hook that returned the popped name would replace the output
        stack.pop()

    handles = []
    for path, module in root.named_modules():
        label = path or type(root).__name__
        handles.append(module.register_forward_pre_hook(lambda _m, _a, label=label: stack.append(label)))
        handles.append(module.register_forward_hook(leave))
    try:
        with torch.no_grad(), Recorder():
            run()
    finally:
        for handle in handles:
            handle.remove()
    return list(found.values())


def _dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


def _bits(dtype: Any) -> int:
    import torch

    return torch.finfo(dtype).bits


def describe_below(rows: list[dict[str, Any]]) -> str:
    """"routed_experts.inner_experts ran _grouped_mm in bfloat16 (3 calls)", one clause per row."""
    return "; ".join(f"{r['module']} ran {r['op']} in {'/'.join(r['dtypes'])} ({r['calls']} call"
                     f"{'s' if r['calls'] != 1 else ''})" for r in rows)
