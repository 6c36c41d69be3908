"""Phase 3c kernel alignment: HF's experts kernel carrying Titan's weights, and Titan's routed path on HF's routing.

The skill's step 3 verifies a kernel difference by running the experts with the other side's kernel on the
same weights. These helpers make that possible for the stage trace (``stage_trace.py``): Titan's routed
expert weights re-fused into the HF experts module's own layout and swapped into it in place (restored on
exit), and Titan's dispatch + experts + combine called on HF's routing decision in the layout the target's
``RoutedExperts`` takes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


def titan_expert_weights(titan: Any, hf_experts: Any) -> dict[str, Any]:
    """Titan's routed expert weights in the HF experts' own layout, by the names HF's module holds.

    Gated experts fuse gate and up (``gate_up_proj``, (E, 2I, H)) or keep them apart; non-gated
    experts (Nemotron-H's relu^2) hold ``up_proj`` alone, which Titan's first projection carries.
    """
    import importlib

    from phases.add_moe_model.work.moe_blocks import EXP

    names = importlib.import_module(f"{EXP}.state_dict_adapter")._expert_names()
    return expert_weights_as_hf(titan.routed_experts.inner_experts, hf_experts, names=names)


def expert_weights_as_hf(inner: Any, hf_experts: Any, *, names: tuple[str, str, str]) -> dict[str, Any]:
    """``names``: Titan's (gate, down, up) weight attributes, as the target's adapter gives them."""
    import torch

    gate_name, down_name, up_name = names
    gate, down, up = (getattr(inner, n, None) for n in names)
    if down is None:
        raise ValueError(f"Titan's experts ({type(inner).__name__}) have no {down_name}")
    out = {"down_proj": down}
    if hasattr(hf_experts, "gate_up_proj"):
        if gate is None or up is None:
            raise ValueError(f"HF's experts are gated (gate_up_proj) but Titan's {type(inner).__name__} lacks "
                             f"{gate_name if gate is None else up_name}")
        out["gate_up_proj"] = torch.cat([gate, up], dim=1)
    elif hasattr(hf_experts, "gate_proj"):
        out.update(gate_proj=gate, up_proj=up)
    elif gate is not None and up is not None:
        raise ValueError(f"HF's experts are not gated (up_proj alone) but Titan's {type(inner).__name__} holds "
                         f"both {gate_name} and {up_name}: a gated kernel cannot reproduce them; the conversion "
                         "needs a non-gated expert class in the experiment folder")
    else:
        # Non-gated: a Titan class for them keeps its one input projection under the gate or the up name.
        out["up_proj"] = up if up is not None else gate
    missing = [name for name, value in out.items() if value is None]
    if missing:
        raise ValueError(f"Titan's experts ({type(inner).__name__}) have nothing for HF's {missing}")
    return out


@contextlib.contextmanager
def titan_weights_in(hf_experts: Any, titan: Any) -> Iterator[Any]:
    """The HF experts module carrying Titan's weights, swapped in place and restored on exit.

    In place rather than on a copy: a copy of Mixtral-sized experts (2.8 GB in bf16 per copy)
    got the worker killed for memory on a shared 24 GiB machine.
    """
    saved = {}
    try:
        for name, value in titan_expert_weights(titan, hf_experts).items():
            current = getattr(hf_experts, name, None)
            if current is None or tuple(current.shape) != tuple(value.shape):
                have = None if current is None else tuple(current.shape)
                raise ValueError(f"HF experts.{name} has shape {have}, Titan gives {tuple(value.shape)}: "
                                 "layouts differ, fix the transpose in state_dict_adapter.py")
            saved[name] = current.data
            current.data = value.detach().to(current.dtype)
        yield hf_experts
    finally:
        for name, data in saved.items():
            getattr(hf_experts, name).data = data


def compare_expert_weights(hf_experts: Any, titan: Any) -> dict[str, float]:
    out = {}
    for name, value in titan_expert_weights(titan, hf_experts).items():
        hf = getattr(hf_experts, name, None)
        if hf is not None and tuple(hf.shape) == tuple(value.shape):
            out[name] = (hf.float() - value.float()).abs().max().item()
    return out


def experts_arguments(args: tuple, kwargs: dict) -> tuple[Any, Any, Any]:
    """(hidden_states, top_k_index, top_k_weights) of one recorded call of an HF experts module."""
    names = ("hidden_states", "top_k_index", "top_k_weights")
    values = list(args) + [kwargs[n] for n in names[len(args):]]
    return values[0], values[1], values[2]


def run_titan_routed(titan: Any, hidden: Any, indices: Any, weights: Any) -> Any:
    """Titan's dispatch + GroupedExperts + combine on HF's routing decision, in the layout it takes."""
    import torch

    from phases.add_moe_model.work.layout import detect_routed_layout

    layout = detect_routed_layout(titan.routed_experts)
    ids = layout.per_token(indices).long()
    counts = torch.bincount(ids.flatten(), minlength=titan.routed_experts.inner_experts.num_experts)
    return titan.routed_experts(layout.per_token(hidden), layout.per_token(weights).float(), ids, counts)
