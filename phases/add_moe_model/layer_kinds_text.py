"""The real model's decoder-layer kinds as MODEL_COMPATIBILITY.md and the commit message show them.

The probe records each distinct kind (attention x MLP) with its layer indices and what it ran on it
(``Probe.layer_kinds``); the synthetic entry records which real layer each of its layers copies
(``Synthetic.layers``). One line per kind says which phase built and checked it: the probe's checks,
and numerics with the sharding build check where the entry holds a layer of the kind. A kind the entry
does not hold is said to be unbuilt by them. Runs from before these records render no lines.
"""

from __future__ import annotations

from typing import Any

from phases.add_moe_model.cited import Cited
from phases.add_moe_model.records import Results


def layer_kind_lines(results: Results, cited: Cited) -> list[dict[str, Any]]:
    """One {"head", "parts"} per kind of the real model (its layers; what the probe ran on it; which layer of the
    synthetic entry holds it, so numerics and the build check built it); empty when the probe recorded no kinds."""
    if results.probe is None:
        return []
    kinds = results.probe.model_dump(mode="json").get("layer_kinds") or []
    planned = (results.synthetic_config.model_dump(mode="json").get("layers") or []) if results.synthetic_config \
        else []
    return [kind_lines(kind, planned, cited) for kind in kinds]


def kind_lines(kind: dict[str, Any], planned: list[dict[str, Any]], cited: Cited) -> dict[str, Any]:
    findings = ", ".join(kind.get("findings") or []) or "none"
    probe = f"probe ({cited.phase('probe')}): {'; '.join(kind.get('checked') or []) or 'ran nothing'}; " \
            f"its findings: {findings}"
    held = [p["layer"] for p in planned if p.get("kind") == kind.get("name")]
    if held:
        built = (f"synthetic entry layer {', '.join(map(str, held))} ({cited.phase('synthetic_config')}): built by "
                 f"numerics ({cited.phase('numerics')}) and the sharding build check ({cited.phase('parallelism')})")
    else:
        built = "synthetic entry: no layer of this kind, so numerics and the sharding build check did not build it"
    head = f"{kind.get('name')}: {_layers_text(kind.get('layers') or [])} ({kind.get('attention_module')}; " \
           f"{kind.get('mlp_module')})"
    return {"head": head, "parts": [probe, built]}


def _layers_text(indices: list[int]) -> str:
    """"layer 5" or "layers 0-4, 6-10, 12"."""
    parts, start = [], None
    for i, index in enumerate(indices):
        start = index if start is None else start
        if i + 1 == len(indices) or indices[i + 1] != index + 1:
            parts.append(str(index) if start == index else f"{start}-{index}")
            start = None
    return f"layer{'s' if len(indices) > 1 else ''} {', '.join(parts)}"
