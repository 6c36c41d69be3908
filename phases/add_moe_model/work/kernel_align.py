"""Phase 3c step 3 worker: is a residual gap a kernel difference or a transfer bug?

Runs the unmodified HF MoE part once (same input, seed and fp32 gate cast as the
numerics worker) and records what its experts module received (hidden states, top-k
indices and weights) and returned. Then, on exactly that routed input:

1. HF's own experts kernel with Titan's expert weights *after* the target adapter's
   transfer (re-fused into HF's fused layout) -> ``hf_kernel_on_titan_weights_max_diff``.
   0.0 means the weights arrived bit-exact and the HF kernel reproduces itself, so any
   remaining Titan-vs-HF gap is a "verified kernel difference".
2. Titan's routed-experts path (dispatch, GroupedExperts, combine) on HF's routing ->
   ``titan_kernel_on_hf_routing_max_diff``: the size of that kernel difference.

The record hook on ``experts`` only reads arguments; it changes nothing on the HF side.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, Field

from phases.add_moe_model.work.numerics import CompareRequest


class KernelAlignResult(BaseModel):
    """Response of ``kernel_alignment``."""

    model_type: str
    dtype: str
    device: str
    status: Literal["verified", "not_verified", "ERROR", "SKIP"]
    reason: str = ""
    hf_experts_impl: str = ""
    hf_kernel_on_titan_weights_max_diff: float | None = None
    titan_kernel_on_hf_routing_max_diff: float | None = None
    titan_kernel_on_hf_routing_kl: float | None = None
    weight_max_diff: dict[str, float] = Field(default_factory=dict)
    versions: dict[str, str] = Field(default_factory=dict)
    seed: int
    error: str | None = None


def kernel_alignment(request: dict[str, Any]) -> dict[str, Any]:
    """Request: ``CompareRequest`` fields (model_type, config_kwargs, dtype, device, seed)."""
    from phases.add_moe_model.work import numerics
    from phases.add_moe_model.work.error_origin import describe_error

    req = CompareRequest.model_validate(request)
    base = dict(model_type=req.model_type, dtype=req.dtype, device=req.device, seed=req.seed)
    try:
        bench = numerics.prepare_bench(req, first_dtype=req.dtype)
        if bench.site is None:
            return KernelAlignResult(**base, status="SKIP", reason="no MoE layer").model_dump()
        return _align(bench, dtype=req.dtype).model_dump()
    except Exception as exc:  # noqa: BLE001 - reported as an ERROR result
        return KernelAlignResult(**base, status="ERROR", error=describe_error(exc)).model_dump()


def _align(bench: Any, *, dtype: str) -> KernelAlignResult:
    import torch

    from phases.add_moe_model.work import moe_blocks, numerics
    from phases.add_moe_model.work.kl import measure_output_gap

    dt, dev = getattr(torch, dtype), torch.device(bench.device)
    calls: list[tuple[tuple, dict, Any]] = []
    handle = bench.site.experts.register_forward_hook(
        lambda _m, args, kwargs, out: calls.append((args, kwargs, out)), with_kwargs=True)
    try:
        numerics.run_hf_side(bench.site, hidden=bench.config.hidden_size, dtype=dt, device=dev, seed=bench.seed)
    finally:
        handle.remove()
    if len(calls) != 1:
        raise RuntimeError(f"expected one call of the HF experts module, saw {len(calls)}")
    args, kwargs, hf_expert_out = calls[0]
    params = moe_blocks.probe_moe_params(bench.site, bench.config)
    titan = moe_blocks.build_titan_moe({**params, "shared_expert_info": None}, bench.config, device=dev, dtype=dt)
    moe_blocks.load_through_adapter(titan, bench.site)
    with torch.no_grad(), titan_weights_in(bench.site.experts, titan) as hf_kernel:
        hf_on_titan = hf_kernel(*args, **kwargs)
    with torch.no_grad():
        titan_out = run_titan_routed(titan, *_routing(args, kwargs))
    gap = measure_output_gap(hf_expert_out, titan_out.reshape(hf_expert_out.shape))
    same = (hf_on_titan.float() - hf_expert_out.float()).abs().max().item()
    status = "verified" if same == 0.0 else "not_verified"
    reason = explain_alignment(weights_exact=same == 0.0, kernel_gap=gap["max_diff"])
    return KernelAlignResult(model_type=bench.model_type, dtype=dtype, device=bench.device, status=status,
                             reason=reason, hf_experts_impl=bench.hf_impl,
                             hf_kernel_on_titan_weights_max_diff=same,
                             titan_kernel_on_hf_routing_max_diff=gap["max_diff"],
                             titan_kernel_on_hf_routing_kl=gap["kl"],
                             weight_max_diff=compare_expert_weights(bench.site.experts, titan),
                             versions=bench.versions, seed=bench.seed)


def explain_alignment(*, weights_exact: bool, kernel_gap: float | None) -> str:
    if not weights_exact:
        return ("HF's kernel on Titan's transferred weights differs from HF: the weights or their "
                "transfer differ, so the gap is not only a kernel difference")
    if kernel_gap == 0.0:
        return ("weights transfer bit-exactly and Titan's experts+combine reproduce HF exactly on HF's "
                "routing: any block-level gap left comes from the router (scores / top-k), not the kernel")
    return (f"weights transfer bit-exactly; Titan's experts+combine differ from HF's kernel by max "
            f"{kernel_gap:.2e} on identical routing: a verified kernel difference")


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


def _routing(args: tuple, kwargs: dict) -> tuple[Any, Any, Any]:
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
