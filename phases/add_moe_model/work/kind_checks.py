"""The target's code on every kind of decoder layer of the real model, at real size on meta (worker side).

The probe builds the whole real-depth model on meta (cheap) and runs here, per layer, the target's
sharding setup and completeness backstop (``sharding_checks.check_layer_sharding``) and, for the first
layer of each MoE kind, the target's MoE detection, probe and Titan MoE build (the swap's config, built
on meta: materialising real-size experts is the build check's, on the synthetic config). A finding names
the kind, the layers it failed on and where to fix; what ran on each kind is kept on the kind
(``LayerKind.checked``), so "which kinds were built and checked" is read, not guessed.
"""

from __future__ import annotations

from typing import Any

from phases.add_moe_model.compat import CompatIssue, LayerKind
from phases.add_moe_model.work import hf_checks, sharding_checks
from phases.add_moe_model.work.layer_kinds import kind_of, layers_text
from phases.add_moe_model.work.probe_failure import probe_failure_issue

SHARDING_RAN = "sharding: the target's _set_layer_sharding_configs and _assert_all_states_sharded on every layer"


def check_kinds_sharding(scan: list[dict[str, Any]], kinds: list[LayerKind],
                         sharding: Any) -> tuple[list[CompatIssue], dict[str, set[str]]]:
    """Run the target's sharding setup on every built layer: one finding per code, naming each kind it hit,
    and kind name -> the codes found on its layers."""
    found: dict[int, list[CompatIssue]] = {}
    for row in scan:
        found[row["index"]] = sharding_checks.check_layer_sharding(sharding, row["layer"], index=row["index"],
                                                                   moe_attr=row["attr"])
    of = kind_of(kinds)
    codes: dict[str, set[str]] = {kind.name: set() for kind in kinds}
    for index, issues in found.items():
        codes[of[index].name] |= {i.code for i in issues}
    return merge_by_kind(found, kinds), codes


def merge_by_kind(found: dict[int, list[CompatIssue]], kinds: list[LayerKind]) -> list[CompatIssue]:
    """Layer index -> its findings, merged per code: "kind K at layers 5, 11: <the first such layer's message>"."""
    of = kind_of(kinds)
    by_code: dict[str, dict[str, list[tuple[int, CompatIssue]]]] = {}
    for index in sorted(found):
        for issue in found[index]:
            by_code.setdefault(issue.code, {}).setdefault(of[index].name, []).append((index, issue))
    merged = []
    for per_kind in by_code.values():
        parts, said = [], {}
        for name, hits in per_kind.items():
            index, issue = hits[0]
            text = issue.message.removeprefix(f"layer {index}: ").replace(f"layers.{index}.", "layers.N.")
            where = f"kind '{name}' at {layers_text([i for i, _ in hits])}"
            parts.append(f"{where}: the same as {said[text]}" if text in said else f"{where}: {issue.message}")
            said.setdefault(text, f"layer {index}")
        first = next(iter(per_kind.values()))[0][1]
        merged.append(first.model_copy(update={"message": "; ".join(parts)}))
    return merged


def probe_other_moe_kinds(scan: list[dict[str, Any]], kinds: list[LayerKind], config: Any,
                          target: dict[str, Any]) -> tuple[list[CompatIssue], dict[str, str]]:
    """The target's MoE detection, probe and Titan MoE build (meta) on the first layer of every MoE kind after
    the first (the first is the probe's own, with every check): findings (each naming its kind), and kind
    name -> what ran."""
    import torch

    moe_kinds = [k for k in kinds if k.mlp.startswith("moe")]
    rows = {r["index"]: r for r in scan}
    issues: list[CompatIssue] = []
    ran: dict[str, str] = {}
    for kind in moe_kinds[1:]:
        row = rows[kind.layers[0]]
        found = hf_checks.check_moe_site(row["attr"], target_attrs=row["target_attrs"])
        layer_level = row["attr"] == "<layer>"
        probe = target["moe"]._probe_layer_level_moe if layer_level else target["moe"]._probe_hf_moe_block
        ran[kind.name] = (f"MoE: the target's {probe.__name__} and _build_moe_config(...).build() on layer "
                          f"{row['index']} (meta)")
        try:
            params = probe(row["block"], config)
            with torch.device("meta"):
                target["moe"]._build_moe_config(params, config).build()
        except (ValueError, AttributeError, TypeError, KeyError) as exc:
            found.append(probe_failure_issue(probe.__name__, row["block"], config, exc))
        issues += [i.model_copy(update={"message": f"kind '{kind.name}' at {layers_text(kind.layers)}: "
                                                   f"layer {row['index']}: {i.message}"}) for i in found]
    return issues, ran
