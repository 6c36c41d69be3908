"""Which kinds of decoder layer were built and checked, and by which phase: one row per kind (engine side).

The probe describes the real model's layers once (``Probe.layer_kinds``: each kind with its real indices
and what the probe ran on it); the synthetic phase says which layer of its entry holds each kind
(``Synthetic.layers``); the build check says which of the entry's layers failed at each world size
(``failed_layers``); numerics compares the entry's first MoE layer's block and round-trips the whole
entry. The rows join those records, so the compat doc, the summaries and the commit read one table
instead of guessing; a kind no phase built says so in its row.
"""

from __future__ import annotations

from typing import Any

from phases.add_moe_model.compat import index_ranges as ranges
from phases.add_moe_model.records import BuildCheckRow, Probe, Results, Synthetic


def layer_kind_rows(results: Results) -> list[dict[str, Any]]:
    """One row per kind of the real model: name, real layers, and each phase's part (JSON values)."""
    probe = results.probe
    if probe is None:
        return []
    held = synthetic_layers(results.synthetic_config)
    first_moe = next((p for p in sorted(held.values()) if _is_moe(probe, held, p)), None)
    rows = []
    for kind in probe.layer_kinds:
        layer = held.get(kind.name)
        rows.append({
            "kind": kind.name, "layers": ranges(kind.layers), "attention_module": kind.attention_module,
            "mlp_module": kind.mlp_module,
            "probe": f"FAIL ({', '.join(kind.findings)})" if kind.findings else "PASS",
            "probe_checked": list(kind.checked),
            "synthetic_layer": layer,
            "build_check": build_check_cell(results, layer),
            "numerics": numerics_cell(results, layer, first_moe=first_moe),
        })
    return rows


def synthetic_layers(synthetic: Synthetic | None) -> dict[str, int]:
    """Kind name -> the first layer of the synthetic entry that holds it."""
    held: dict[str, int] = {}
    for planned in synthetic.layers if synthetic else ():
        if planned.kind:
            held.setdefault(planned.kind, planned.layer)
    return held


def build_check_cell(results: Results, layer: int | None) -> str:
    """"world 2 PASS, world 4 FAIL, ..." for the entry's layer holding the kind."""
    checks = results.parallelism.build_check if results.parallelism else ()
    if results.synthetic_config is None or not checks:
        return "not run"
    if layer is None:
        return "not built (no layer of the synthetic entry holds this kind)"
    return ", ".join(f"world {r.world_size} {world_verdict(r, layer)}" for r in checks)


def world_verdict(row: BuildCheckRow, layer: int) -> str:
    if row.status != "FAIL":
        return row.status
    if row.failed_layers:
        return "FAIL" if layer in row.failed_layers else "PASS (another layer failed)"
    return "FAIL (not traced to a layer)"


def numerics_cell(results: Results, layer: int | None, *, first_moe: int | None) -> str:
    numerics = results.numerics
    if numerics is None or layer is None:
        return "not run" if numerics is None else "not built"
    roundtrip = numerics.verdict.roundtrip.status if numerics.verdict.roundtrip else "not measured"
    if layer == first_moe:
        return f"MoE block compared ({numerics.verdict.status}); state-dict round trip {roundtrip}"
    return f"state-dict round trip {roundtrip} (the MoE block compared is layer {first_moe}'s)"


def kinds_of_layers(results: Results, layers: list[int]) -> str:
    """"synthetic layer 2 holds 'mla (full_attention) x moe' (real layers 5, 11)" for layers of the entry."""
    probe, synthetic = results.probe, results.synthetic_config
    if not layers or synthetic is None or probe is None:
        return ""
    real = {kind.name: kind.layers for kind in probe.layer_kinds}
    named = {p.layer: p.kind for p in synthetic.layers}
    parts = [f"synthetic layer {i} holds '{named[i]}' (real layers {ranges(real.get(named[i], []))})"
             if named.get(i) else f"synthetic layer {i}" for i in layers]
    return "; ".join(parts)


def kinds_summary(probe: Probe | Any) -> str:
    """"3 layer kinds: linear (linear_attention) x dense (layers 0-1), ..." of a Probe or a CompatReport."""
    kinds = probe.layer_kinds
    listed = ", ".join(f"{k.name} (layers {ranges(k.layers)})" for k in kinds)
    return f"{len(kinds)} layer kind{'s' if len(kinds) != 1 else ''}: {listed}" if kinds else ""


def _is_moe(probe: Probe, held: dict[str, int], layer: int) -> bool:
    names = [name for name, at in held.items() if at == layer]
    return any(k.mlp.startswith("moe") for k in probe.layer_kinds if k.name in names)
