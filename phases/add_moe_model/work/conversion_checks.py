"""Two conversions judged on what the target does with them, not on HF's structure (worker side).

- Interleaved gate/up columns. An HF experts class that splits ``gate_up_proj`` as ``[..., ::2]`` /
  ``[..., 1::2]`` (gpt_oss) needs its gate columns in Titan's gate weight and its up columns in the up
  weight. The target's own adapter converts a small ``gate_up_proj`` in HF's layout whose every value
  names its place; the finding stands while Titan's gate weight is not exactly HF's gate columns.
- A router bias. HF's router adds a bias to its logits; the finding stands while the Titan MoE the
  target builds has no gate bias, or the strict load of the target's conversion does not carry it.
"""

from __future__ import annotations

import re
from typing import Any

from phases.add_moe_model.compat import CompatIssue
from phases.add_moe_model.work.hf_checks import MOE_REPLACEMENT, STATE_DICT_ADAPTER, _class_source

_PREFIX = "model.layers.0.mlp."
_SMALL = {"experts": 2, "intermediate": 3}


def hf_interleaves_gate_up(experts: Any) -> bool:
    """HF's experts class splits gate_up_proj's columns as interleaved (::2) instead of in halves."""
    return bool(re.search(r"\[\s*\.\.\.\s*,\s*(0|1)?::2\s*\]", _class_source(type(experts))))


def _small_hf_experts(experts: Any, hidden: int) -> tuple[dict[str, Any], int]:
    """The experts' own parameters in HF's layout with E=2 and I=3 (hidden kept), and the axis of 2I.

    Every value of gate_up_proj is distinct (its flat index), so where each lands says what the adapter did.
    """
    import torch

    real = tuple(experts.gate_up_proj.shape)
    axis = 2 if real[1] == hidden and real[2] != hidden else 1
    sizes = {real[axis]: 2 * _SMALL["intermediate"], real[axis] // 2: _SMALL["intermediate"]}
    small = {}
    for name, param in experts.named_parameters(recurse=False):
        shape = (_SMALL["experts"], *(sizes.get(int(d), int(d)) for d in param.shape[1:]))
        small[name] = torch.arange(int(torch.Size(shape).numel()), dtype=torch.float32).reshape(shape)
    return small, axis


def titan_gate_from_target(adapter: Any, experts: Any, hidden: int) -> tuple[Any, Any]:
    """(what the target's adapter makes Titan's gate weight, HF's gate columns in Titan's (E, I, H) layout)."""
    import torch

    small, axis = _small_hf_experts(experts, hidden)
    gate_up = small["gate_up_proj"]
    converted = adapter.hf_to_titan_moe_state_dict({f"{_PREFIX}experts.{k}": v for k, v in small.items()})
    gate_name = adapter._expert_names()[0]
    titan_gate = next((v for k, v in converted.items() if k.endswith(f".{gate_name}")), None)
    hf_gate = gate_up.index_select(axis, torch.arange(0, gate_up.shape[axis], 2))
    return titan_gate, hf_gate.transpose(1, 2) if axis == 2 else hf_gate


def check_gate_up_interleaved(experts: Any, adapter: Any, *, hidden: int) -> list[CompatIssue]:
    """HF interleaves gate/up columns; stands while the target's conversion does not give Titan the gate columns."""
    import torch

    if getattr(experts, "gate_up_proj", None) is None or not hf_interleaves_gate_up(experts):
        return []
    try:
        titan_gate, hf_gate = titan_gate_from_target(adapter, experts, hidden)
    except Exception as exc:  # noqa: BLE001 - the target's adapter raising on HF's layout is the finding's evidence
        titan_gate, hf_gate, did = None, None, f"its adapter raised {type(exc).__name__}: {exc}"[:300]
    else:
        did = _what_the_gate_got(titan_gate, hf_gate)
    if titan_gate is not None and tuple(titan_gate.shape) == tuple(hf_gate.shape) and torch.equal(titan_gate, hf_gate):
        return []
    return [
        CompatIssue(
            code="gate_up_interleaved",
            message=(f"{type(experts).__name__} splits gate_up_proj as interleaved columns (gate ::2, up 1::2), "
                     f"but converting a small gate_up_proj in HF's layout with the target's adapter, {did}"),
            fix_location=f"{STATE_DICT_ADAPTER} (de-interleave in hf_to_titan_moe_state_dict / "
                         "re-interleave in titan_to_hf_moe_state_dict)",
            severity="fixable",
        )
    ]


def _what_the_gate_got(titan_gate: Any, hf_gate: Any) -> str:
    if titan_gate is None:
        return "Titan's gate weight does not come out at all"
    if tuple(titan_gate.shape) != tuple(hf_gate.shape):
        return (f"Titan's gate weight comes out {tuple(titan_gate.shape)}, not HF's gate columns "
                f"{tuple(hf_gate.shape)} in Titan's (E, I, H) layout")
    return "Titan's gate weight holds other values than HF's gate columns (the adapter splits gate_up_proj in halves)"


def check_router_bias(router: Any, *, strict: Any, titan_has_bias: bool | None) -> list[CompatIssue]:
    """HF's router has a bias; stands while the target's Titan router has none or its strict load drops it.

    ``titan_has_bias`` is None when the target built no Titan MoE (its probe raised).
    """
    bias = getattr(router, "bias", None)
    if bias is None or callable(bias):
        return []
    bias_keys = [k for k in (*strict.missing, *strict.unexpected) if "router" in k and "bias" in k]
    if titan_has_bias and not bias_keys:
        return []
    built = {None: "the target builds no Titan MoE to hold it",
             False: "the Titan MoE the target builds has a router gate without bias",
             True: "the Titan MoE the target builds has a router gate bias"}[titan_has_bias]
    loaded = f", and its strict load leaves {bias_keys} unmatched" if bias_keys else ""
    return [
        CompatIssue(
            code="router_bias_dropped",
            message=f"{type(router).__name__} adds a bias to its logits; {built}{loaded}",
            fix_location=f"{MOE_REPLACEMENT} (_build_moe_config: make_router_config(bias=...)) and "
                         f"{STATE_DICT_ADAPTER} (_build_hf_to_titan_patterns)",
            severity="fixable",
        )
    ]
