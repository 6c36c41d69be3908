"""Which token layout the target's Titan MoE takes: ``x_BLD`` (B, L, D) or ``x_TD`` (T, D).

torchtitan 0.3.0's ``MoE.forward`` takes ``x_BLD``; later trees take flattened tokens
``x_TD``. Feeding the wrong one does not fail cleanly (a broadcast error deep in the
router, or an out-of-range index in the dispatcher), so the workers read the layout from
the target's own code before calling it: torchtitan names its tensors by their dims, so
the first argument of ``forward`` says it. When that name says neither, one tiny call in
each shape decides; when neither works, ``UnknownMoeLayout`` names the class, its
signature and its file:line, so the run ends on that finding instead of a wrong triage.
Never a version string: a tree is judged by what its code takes.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

DIMS = {"BLD": 3, "TD": 2}


class UnknownMoeLayout(RuntimeError):
    """The target's MoE takes a token layout the workers do not know (message: what and where)."""


class UnknownTargetApi(RuntimeError):
    """A function or table the workers call is not in the target's module (message: which and where)."""


def target_attr(module_name: str, attr: str) -> Any:
    """``module_name.attr`` of the target, or UnknownTargetApi naming the module's file."""
    import importlib

    module = importlib.import_module(module_name)
    if not hasattr(module, attr):
        path = getattr(module, "__file__", "?") or "?"
        cut = path.rfind("torchtitan/")
        raise UnknownTargetApi(f"unknown target API: {module_name} has no {attr} ({path[cut:] if cut >= 0 else path}); "
                               "the workers call it as torchtitan 0.3.0 and main b5bcd76c6 define it")
    return getattr(module, attr)


@dataclass(frozen=True, kw_only=True)
class MoeLayout:
    """A known layout and the code that showed it.

    Attributes:
        name: "BLD" or "TD".
        evidence: e.g. "MoE.forward(self, x_TD) at torchtitan/models/common/moe.py:396".
    """

    name: str
    evidence: str

    def tokens(self, x_BLD: Any) -> Any:
        """``x_BLD`` in the shape this layout's forward takes."""
        return x_BLD if self.name == "BLD" else x_BLD.reshape(-1, x_BLD.shape[-1])

    def per_token(self, values: Any) -> Any:
        """A per-token tensor (..., K) as (1, T, K) for BLD or (T, K) for TD."""
        flat = values.reshape(-1, values.shape[-1])
        return flat.unsqueeze(0) if self.name == "BLD" else flat


def where(function: Any) -> str:
    """``path:line`` of a function, the path from ``torchtitan/`` on."""
    try:
        path = inspect.getsourcefile(function) or "?"
        line = inspect.getsourcelines(function)[1]
    except (OSError, TypeError):
        return "?"
    cut = path.rfind("torchtitan/")
    return f"{path[cut:] if cut >= 0 else path}:{line}"


def signature_text(function: Any) -> str:
    try:
        return f"{function.__qualname__}{inspect.signature(function)}"
    except (TypeError, ValueError):
        return getattr(function, "__qualname__", repr(function))


def first_argument(function: Any) -> str:
    params = [p for p in inspect.signature(function).parameters.values() if p.name != "self"]
    return params[0].name if params else ""


def from_signature(cls: type) -> MoeLayout | None:
    """The layout named by the first argument of ``cls.forward`` (``x_BLD`` / ``x_TD``), else None."""
    forward = cls.forward
    suffix = first_argument(forward).rpartition("_")[2]
    if suffix not in DIMS:
        return None
    return MoeLayout(name=suffix, evidence=f"{signature_text(forward)} at {where(forward)}")


def detect_moe_layout(moe: Any, *, hidden: int) -> MoeLayout:
    """Layout of a materialized Titan MoE: its signature, else one small call in each shape."""
    found = from_signature(type(moe))
    return found if found is not None else _by_call(moe, hidden=hidden)


def detect_routed_layout(routed_experts: Any) -> MoeLayout:
    """Layout of ``RoutedExperts.forward`` (tokens, scores, ids, counts): by signature only."""
    found = from_signature(type(routed_experts))
    if found is None:
        raise UnknownMoeLayout(_unknown(type(routed_experts), "its first argument names neither "
                                        "x_BLD (B, L, D) nor x_TD (T, D)"))
    return found


def _by_call(moe: Any, *, hidden: int) -> MoeLayout:
    import torch

    param = next(iter(moe.parameters()), None)
    dtype, device = (param.dtype, param.device) if param is not None else (torch.float32, torch.device("cpu"))
    works, seen = [], []
    for name, shape in (("BLD", (1, 4, hidden)), ("TD", (4, hidden))):
        x = torch.randn(*shape, dtype=dtype, device=device)
        try:
            with torch.no_grad():
                out = moe(x)
        except Exception as exc:  # noqa: BLE001 (a failing shape is the evidence)
            seen.append(f"{list(shape)} -> {type(exc).__name__}: {exc}")
            continue
        out_shape = tuple(getattr(out, "shape", ()))
        seen.append(f"{list(shape)} -> output {list(out_shape)}")
        if out_shape == tuple(shape):
            works.append(name)
    if len(works) == 1:
        forward = type(moe).forward
        return MoeLayout(name=works[0], evidence=f"{signature_text(forward)} at {where(forward)}: only the "
                                                 f"{works[0]} call returned its input's shape ({'; '.join(seen)})")
    raise UnknownMoeLayout(_unknown(type(moe), "its first argument names neither x_BLD nor x_TD, and calls "
                                    f"in both shapes gave: {'; '.join(seen)}"))


def _unknown(cls: type, what: str) -> str:
    return (f"unknown MoE token layout: {signature_text(cls.forward)} at {where(cls.forward)}: {what}; the "
            "workers know x_BLD (B, L, D, torchtitan 0.3.0) and x_TD (T, D); teach "
            "phases/add_moe_model/work/layout.py this one")
