"""Phase 1 worker: the add_moe_model compatibility probe against the target checkout.

Runs in a fresh subprocess whose sys.path starts with the target, so every torchtitan
function called here (``_probe_hf_moe_block``, ``_build_moe_config``, the state-dict
adapter, the sharding helpers) is the target's, edits included. One import, one meta
build of the whole real-depth model, described once as its kinds of decoder layer
(work/layer_kinds.py) and checked kind by kind with the target's code (work/kind_checks.py),
one meta Titan MoE per MoE kind, one tiny materialized twin holding a layer of each kind for
round-trip values and the semantic checks (work/tiny_twin.py): that keeps the probe near the
floor of "import the experiment + build the config on meta".
"""

from __future__ import annotations

import time
from typing import Any

from phases.add_moe_model.compat import (
    CompatIssue, CompatReport, KeyCheck, LayerKind, ProbeRequest, ProbeResponse, WorkerError, index_ranges,
)
from phases.add_moe_model.model_source import ModelSource
from phases.add_moe_model.work import conversion_checks, hf_checks, kind_checks, sharding_checks, state_dict_checks
from phases.add_moe_model.work.config_fields import read_field
from phases.add_moe_model.work.hf_config import HFConfigError, build_hf_config, raise_build_error
from phases.add_moe_model.work.layer_kinds import attention_summary, describe_layers
from phases.add_moe_model.work.layers import predict_moe_layers, resolve_moe_mechanism
from phases.add_moe_model.work.probe_failure import probe_failure_issue
from phases.add_moe_model.work.tiny_twin import build_tiny_twin, check_semantics
from orchestrator.progress import report

EXP_PKG = "torchtitan.experiments.transformers_modeling_backend"


def probe(request: dict) -> dict:
    """Worker entry: ProbeRequest dict in, ProbeResponse dict out."""
    req = ProbeRequest.model_validate(request)
    try:
        result = ProbeResponse(report=run_probe(req.source))
    except HFConfigError as exc:
        result = ProbeResponse(error=WorkerError(code=exc.code, message=str(exc)))
    return result.model_dump(mode="json")


def run_probe(source: ModelSource) -> CompatReport:
    """Probe one model on the target checkout importable from sys.path."""
    timings: dict[str, float] = {}
    clock = _Clock(timings)
    config = build_hf_config(source)
    clock.lap("config")
    report("importing the target's transformers backend")
    target = _import_target()
    clock.lap("import")
    predicted = predict_moe_layers(config)
    report("building the HF model on meta", layers=int(config.num_hidden_layers))
    model = _build_meta_model(config)
    scan = _scan_layers(model, target)
    kinds = describe_layers([r["layer"] for r in scan], config)
    clock.lap("meta_build")
    issues, notes, moe_layers = _check_layer_plan(scan, predicted)
    moe = _probe_first_moe(scan, config, target, issues)
    kind_issues, moe_ran = kind_checks.probe_other_moe_kinds(scan, kinds, config, target)
    clock.lap("moe_probe")
    sharding_issues, sharding_codes = kind_checks.check_kinds_sharding(scan, kinds, target["sharding"])
    notes += _dsa_notes(scan)
    tiny, plan, tiny_error = build_tiny_twin(config, kinds)
    roundtrip, strict = _check_state_dicts(model, config, moe, target, issues, tiny=tiny, tiny_error=tiny_error)
    clock.lap("state_dicts")
    issues += _judge_on_target(config, moe, strict, target)
    semantic = check_semantics(tiny, tiny_error, moe, target)
    clock.lap("semantics")
    kinds = _record_checks(kinds, moe=moe, moe_ran=moe_ran, codes=sharding_codes,
                           own=(issues, kind_issues, semantic), plan=plan)
    return _assemble(
        source, config=config, moe_layers=moe_layers, kinds=kinds, moe=moe, notes=notes,
        issues=issues + kind_issues + sharding_issues + semantic, roundtrip=roundtrip, strict=strict,
        timings=timings, target=target,
    )


class _Clock:
    def __init__(self, timings: dict[str, float]) -> None:
        self.timings, self.last = timings, time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.timings[name] = round(now - self.last, 3)
        self.last = now


def _import_target() -> dict[str, Any]:
    import importlib

    import torchtitan

    names = {"moe": "moe_replacement", "adapter": "state_dict_adapter", "sharding": "hf_sharding", "model": "model"}
    mods = {key: importlib.import_module(f"{EXP_PKG}.{name}") for key, name in names.items()}
    mods["path"] = torchtitan.__file__
    return mods


def _build_meta_model(config: Any) -> Any:
    """The whole real-depth model on meta: every layer, so every kind of layer, is built."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config)
    except Exception as exc:  # noqa: BLE001 - transformers' own failure on this config is the answer
        raise_build_error(config, exc)


def _scan_layers(model: Any, target: dict[str, Any]) -> list[dict[str, Any]]:
    """Per built layer: where its MoE is (our scan) and where each of the target's detections looks."""
    rows = []
    for index, layer in enumerate(model.model.layers):
        attr, block = hf_checks.probe_moe_site(layer)
        target_attrs = {path: _target_moe_attr(target[key], layer)
                        for key, path in (("model", hf_checks.MODEL_PY), ("moe", hf_checks.MOE_REPLACEMENT))
                        if hasattr(target[key], "_get_moe_attr_name")}
        rows.append({"index": index, "layer": layer, "attr": attr, "block": block, "target_attrs": target_attrs})
    return rows


def _target_moe_attr(module: Any, layer: Any) -> str | None:
    """What one of the target's ``_get_moe_attr_name`` says for ``layer``: its answer, or "raises E: msg"."""
    try:
        found = module._get_moe_attr_name(layer)
    except (AttributeError, ValueError, KeyError) as exc:
        return f"{hf_checks.RAISES}{type(exc).__name__}: {exc}"
    return found if found is None else str(found)


def _check_layer_plan(scan: list[dict], predicted: list[int]) -> tuple[list[CompatIssue], list[str], list[int]]:
    """Findings, notes and the MoE layers: those the built layers show, else the config's prediction."""
    seen = [r["index"] for r in scan if r["attr"] is not None]
    notes = [f"built all {len(scan)} layers of the real config on meta"]
    if not seen and (unrecognized := hf_checks.check_unrecognized_moe([r["layer"] for r in scan])):
        return unrecognized, notes, predicted
    if seen == predicted:
        return [], notes, seen
    if not seen:
        msg = f"no MoE layer among the {len(scan)} built layers (config predicts {predicted}); no gate/router+experts"
        return [CompatIssue(code="no_moe_layer", message=msg, fix_location="MODEL (is this an MoE model?)",
                            severity="blocker")], notes, predicted
    notes.append(f"the config's mechanism predicts MoE layers {index_ranges(predicted) or 'none'}; the built "
                 f"layers have them at {index_ranges(seen)} (reported)")
    return [], notes, seen


def _probe_first_moe(scan: list[dict], config: Any, target: dict, issues: list[CompatIssue]) -> dict[str, Any]:
    row = next((r for r in scan if r["attr"] is not None), None)
    if row is None:
        return {"row": None, "params": None}
    issues += hf_checks.check_moe_site(row["attr"], target_attrs=row["target_attrs"])
    block, layer_level = row["block"], row["attr"] == "<layer>"
    router = hf_checks.resolve_router(block)
    if hasattr(block, "experts"):
        issues += hf_checks.check_experts(block.experts, config)
    issues += hf_checks.check_router_state(router)
    params = _call_target_probe(target["moe"], block, config, layer_level=layer_level, issues=issues)
    issues += hf_checks.check_score_func(router, block, probed=(params or {}).get("score_func"))
    return {"row": row, "params": params, "layer_level": layer_level}


def _call_target_probe(moe: Any, block: Any, config: Any, *, layer_level: bool,
                       issues: list[CompatIssue]) -> dict | None:
    fn = moe._probe_layer_level_moe if layer_level else moe._probe_hf_moe_block
    try:
        return fn(block, config)
    except (ValueError, AttributeError, TypeError) as exc:
        issues.append(probe_failure_issue(fn.__name__, block, config, exc))
        return None


def _dsa_notes(scan: list[dict]) -> list[str]:
    mixers = (getattr(r["layer"], "self_attn", None) for r in scan)
    return next((n for n in map(sharding_checks.check_dsa_under_tp, mixers) if n), [])


def _check_state_dicts(model: Any, config: Any, moe: dict, target: dict,
                       issues: list[CompatIssue], *, tiny: Any, tiny_error: str) -> tuple[KeyCheck, KeyCheck]:
    report("state-dict round trip and strict load")
    tiny_sd = _random_state_dict(tiny) if tiny is not None else None
    roundtrip = state_dict_checks.check_roundtrip(target["adapter"], model.state_dict(), tiny_sd=tiny_sd,
                                                  tiny_error=tiny_error)
    issues += state_dict_checks.roundtrip_issues(roundtrip)
    if moe.get("params") is None:
        return roundtrip, KeyCheck(verdict="FAIL", note="no Titan MoE: the target's probe did not return parameters")
    strict, strict_issues = _strict_load(model, config, moe, target)
    issues += strict_issues
    return roundtrip, strict


def _strict_load(model: Any, config: Any, moe: dict, target: dict) -> tuple[KeyCheck, list[CompatIssue]]:
    import torch

    row = moe["row"]
    with torch.device("meta"):
        titan_moe = target["moe"]._build_moe_config(moe["params"], config).build()
    moe["titan_router_bias"] = getattr(getattr(titan_moe.router, "gate", None), "bias", None) is not None
    moe["layout_note"] = layout_note(type(titan_moe))
    layer_prefix = f"model.layers.{row['index']}."
    prefix = layer_prefix + ("mlp." if moe["layer_level"] else f"{row['attr']}.")
    layer_sd = {k: v for k, v in model.state_dict().items() if k.startswith(layer_prefix)}
    has_bias = any("correction_bias" in k for k in layer_sd)
    placeless = hf_checks.placeless_state(row["block"], hidden=int(config.hidden_size))
    return state_dict_checks.check_strict_load(
        target["adapter"], titan_moe, layer_sd, prefix=prefix, hf_has_correction_bias=has_bias, placeless=placeless
    )


def layout_note(moe_cls: type) -> str:
    from phases.add_moe_model.work.layout import from_signature, signature_text, where

    found = from_signature(moe_cls)
    if found is None:
        return (f"Titan MoE layout not named by {signature_text(moe_cls.forward)} at {where(moe_cls.forward)}; "
                "the numerics phase decides it with one call in each shape")
    return f"Titan MoE takes x_{found.name}: {found.evidence}"


def _random_state_dict(tiny: Any) -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    return {k: torch.randn_like(v.float()) for k, v in tiny.state_dict().items()}


def _judge_on_target(config: Any, moe: dict, strict: KeyCheck, target: dict) -> list[CompatIssue]:
    """Findings that stand only while the target's own code does the wrong thing (layout, conversion)."""
    row = moe.get("row")
    if row is None:
        return []
    probed_size = (moe.get("params") or {}).get("moe_intermediate_size")
    experts, hidden = getattr(row["block"], "experts", None), int(config.hidden_size)
    issues = [] if experts is None else hf_checks.check_expert_layout(
        experts, hidden=hidden, strict=strict, probed_intermediate=probed_size)
    router, probed = hf_checks.resolve_router(row["block"]), moe.get("params") is not None
    if experts is None:
        issues += hf_checks.check_expert_container(row["block"], row["attr"], probed=probed, strict=strict)
    issues += hf_checks.check_block_output_bias(row["block"], hidden=hidden, probed=probed, strict=strict)
    issues += hf_checks.check_correction_bias(row["block"], router, strict=strict)
    issues += conversion_checks.check_router_bias(router, strict=strict, titan_has_bias=moe.get("titan_router_bias"))
    if experts is not None:
        issues += conversion_checks.check_gate_up_interleaved(experts, target["adapter"], hidden=hidden)
    return issues


def _record_checks(kinds: list[LayerKind], *, moe: dict, moe_ran: dict[str, str], codes: dict[str, set[str]],
                   own: tuple[list[CompatIssue], ...], plan: Any) -> list[LayerKind]:
    """Each kind with what ran on it and the codes found on it."""
    first = moe["row"]["index"] if moe.get("row") else None
    held: dict[str | None, int] = {}
    for planned in plan.layers if plan is not None else ():
        held.setdefault(planned.kind, planned.layer)
    out = []
    for kind in kinds:
        ran, found = [kind_checks.SHARDING_RAN], set(codes.get(kind.name, ()))
        if first in kind.layers:
            ran.append(f"MoE: the target's MoE detection, probe and Titan MoE build (meta), strict load of layer "
                       f"{first}; conversion checks")
            if kind.name in held and not any(i.code == "semantic_checks_not_run" for i in own[2]):
                ran.append(f"semantic checks (score placement, output contract, routing) on the tiny twin's layer "
                           f"{held[kind.name]}")
            found |= {i.code for i in own[0] + own[2] if not i.code.startswith("roundtrip")}
        elif kind.name in moe_ran:
            ran.append(moe_ran[kind.name])
            found |= {i.code for i in own[1] if f"kind '{kind.name}'" in i.message}
        if kind.name in held:
            ran.append(f"value round trip on the tiny twin's layer {held[kind.name]}")
        out.append(kind.model_copy(update={"checked": ran, "findings": sorted(found)}))
    return out


def _dedupe(issues: list[CompatIssue]) -> list[CompatIssue]:
    seen: dict[str, CompatIssue] = {}
    for issue in issues:
        seen.setdefault(issue.code, issue)
    return list(seen.values())


def _shared_kind(params: dict | None, *, layer_level: bool) -> str | None:
    if params is None:
        return None
    info = params.get("shared_expert_info")
    if layer_level:
        return "layer-level"
    if info is None:
        return "none"
    return "sigmoid-gated" if info.get("has_sigmoid_gate") else "additive"


def _assemble(
    source: ModelSource, *, config: Any, moe_layers: list[int], kinds: list[LayerKind], moe: dict,
    issues: list[CompatIssue], notes: list[str], roundtrip: KeyCheck, strict: KeyCheck, timings: dict[str, float],
    target: dict,
) -> CompatReport:
    params = moe.get("params") or {}
    n = int(config.num_hidden_layers)
    row = moe.get("row")
    attention, attention_layers = attention_summary(kinds)
    return CompatReport(
        model_id=source.model_id,
        model_type=config.model_type,
        hidden_size=read_field(config, "hidden_size"),
        intermediate_size=read_field(config, "intermediate_size"),
        moe_intermediate_size=read_field(config, "moe_intermediate_size") or params.get("moe_intermediate_size"),
        num_attention_heads=read_field(config, "num_attention_heads"),
        num_key_value_heads=read_field(config, "num_key_value_heads"),
        num_hidden_layers=n,
        num_experts=params.get("num_experts"),
        top_k=params.get("top_k"),
        score_func=params.get("score_func"),
        route_norm=params.get("route_norm"),
        shared_experts=_shared_kind(moe.get("params"), layer_level=bool(moe.get("layer_level"))),
        attention=attention,
        attention_layers=attention_layers,
        layer_kinds=kinds,
        moe_layers=moe_layers,
        dense_layers=[i for i in range(n) if i not in set(moe_layers)],
        moe_mechanism=resolve_moe_mechanism(config),
        min_layers_needed=moe_layers[0] + 1 if moe_layers else None,
        state_dict_roundtrip=roundtrip.verdict,
        strict_load=strict.verdict,
        issues=_dedupe(issues),
        roundtrip_detail=roundtrip,
        strict_load_detail=strict,
        target_probe=_jsonable(moe.get("params")),
        moe_attr=row["attr"] if row else None,
        built_layers=len(model_layers(kinds)),
        notes=notes + ([moe["layout_note"]] if moe.get("layout_note") else []),
        timings_s=timings,
        torchtitan_path=target["path"],
    )


def model_layers(kinds: list[LayerKind]) -> list[int]:
    return sorted(i for kind in kinds for i in kind.layers)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)
