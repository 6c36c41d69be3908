"""The real model's decoder-layer kinds as MODEL_COMPATIBILITY.md and the commit message show them.

``layer_table.layer_kind_rows`` joins the records (the probe's kinds, the synthetic entry's layers, the
build check by layer, numerics) into one row per kind; this module words each row, naming the event
that recorded every part (``cited``). A kind the synthetic entry does not hold is said to be unbuilt by
numerics and the build check. Runs from before these records render no lines.
"""

from __future__ import annotations

from typing import Any

from phases.add_moe_model.cited import Cited
from phases.add_moe_model.layer_table import layer_kind_rows
from phases.add_moe_model.records import Results


def layer_kind_lines(results: Results, cited: Cited) -> list[dict[str, Any]]:
    """One {"head", "parts"} per kind of the real model (its layers and modules; what the probe ran on it and found;
    the synthetic entry's layer holding it, with the build check's and numerics' verdicts on that layer)."""
    return [kind_lines(row, cited) for row in layer_kind_rows(results)]


def kind_lines(row: dict[str, Any], cited: Cited) -> dict[str, Any]:
    findings = row["probe"].removeprefix("FAIL (").removesuffix(")") if row["probe"] != "PASS" else "none"
    probe = (f"probe ({cited.phase('probe')}): {'; '.join(row['probe_checked']) or 'ran nothing'}; "
             f"its findings: {findings}")
    layer = row["synthetic_layer"]
    if layer is None:
        built = "synthetic entry: no layer of this kind, so numerics and the sharding build check did not build it"
    else:
        built = (f"synthetic entry layer {layer} ({cited.phase('synthetic_config')}): sharding build check "
                 f"{row['build_check']} ({cited.phase('parallelism')}); numerics {row['numerics']} "
                 f"({cited.phase('numerics')})")
    layers = row["layers"]
    head = (f"{row['kind']}: layer{'s' if ',' in layers or '-' in layers else ''} {layers} "
            f"({row['attention_module']}; {row['mlp_module']})")
    return {"head": head, "parts": [probe, built]}
