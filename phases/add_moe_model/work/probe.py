"""Phase 1 worker: the add_moe_model compatibility probe against the target checkout.

Runs in a fresh subprocess whose sys.path starts with the target, so every torchtitan
function called here (``_probe_hf_moe_block``, ``_build_moe_config``, the state-dict
adapter, the sharding helpers) is the target's, edits included. One import, one meta
build of the real config cut to the first MoE layer, one meta Titan MoE, one tiny
materialized model for round-trip values: that keeps the probe near the floor of
"import the experiment + build the config on meta".
"""

from __future__ import annotations

import time
from typing import Any

from phases.add_moe_model.compat import CompatIssue, CompatReport, KeyCheck, ProbeRequest, ProbeResponse, WorkerError
from phases.add_moe_model.model_source import ModelSource
from phases.add_moe_model.work import (
    conversion_checks, hf_checks, semantic_checks, sharding_checks, state_dict_checks,
)
from phases.add_moe_model.work.config_fields import read_field
from phases.add_moe_model.work.hf_config import HFConfigError, build_hf_config, raise_build_error
from phases.add_moe_model.work.layers import build_truncated_config, predict_moe_layers, resolve_moe_mechanism
from phases.add_moe_model.work.probe_failure import probe_failure_issue
from phases.add_moe_model.work.scaled_config import ScalePlan, build_scaled_kwargs
from orchestrator.progress import report

EXP_PKG = "torchtitan.experiments.transformers_modeling_backend"
WIDER_BUILD = 8


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
    report("building the HF model on meta", layers=(predicted[0] + 1) if predicted else config.num_hidden_layers)
    model, built = _build_meta_model(config, predicted)
    scan = _scan_layers(model, target)
    if not any(r["attr"] for r in scan) and built < min(int(config.num_hidden_layers), WIDER_BUILD):
        # NOTE: the config's mechanism may be one layers.py does not know (jamba's expert_layer_period):
        # the evidence is the built layers, so build more of them before calling the model dense.
        predicted = []
        model, built = _build_meta_model(build_truncated_config(config, num_layers=WIDER_BUILD), [])
        scan = _scan_layers(model, target)
        predicted = [r["index"] for r in scan if r["attr"] is not None]
    clock.lap("meta_build")
    issues, notes = _check_layer_plan(scan, predicted, built=built)
    moe = _probe_first_moe(scan, config, target, issues)
    clock.lap("moe_probe")
    issues += _check_sharding(model, scan, target["sharding"], notes)
    tiny, tiny_error = _tiny_model(config, moe)
    roundtrip, strict = _check_state_dicts(model, config, moe, target, issues, tiny=tiny, tiny_error=tiny_error)
    clock.lap("state_dicts")
    issues += _judge_on_target(config, moe, strict, target, tiny, notes)
    clock.lap("semantics")
    return _assemble(
        source, config=config, predicted=predicted, scan=scan, moe=moe, issues=issues, notes=notes,
        roundtrip=roundtrip, strict=strict, timings=timings, target=target, built=built,
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


def _build_meta_model(config: Any, predicted: list[int]) -> tuple[Any, int]:
    import torch
    from transformers import AutoModelForCausalLM

    n = predicted[0] + 1 if predicted else int(config.num_hidden_layers)
    small = build_truncated_config(config, num_layers=n)
    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(small), n
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


def _check_layer_plan(scan: list[dict], predicted: list[int], *, built: int) -> tuple[list[CompatIssue], list[str]]:
    seen = [r["index"] for r in scan if r["attr"] is not None]
    expected = [i for i in predicted if i < built]
    notes = [f"built {built} of the real layers on meta; MoE layers beyond them follow the config's mechanism"]
    if not seen and (unrecognized := hf_checks.check_unrecognized_moe([r["layer"] for r in scan])):
        return unrecognized, notes
    if seen == expected:
        return [], notes
    if not seen:
        msg = f"no MoE layer among the {built} built layers (config predicts {expected}); no gate/router+experts found"
        return [CompatIssue(code="no_moe_layer", message=msg, fix_location="MODEL (is this an MoE model?)",
                            severity="blocker")], notes
    notes.append(f"config mechanism predicts MoE layers {expected} among the built ones, the scan found {seen}")
    return [], notes


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


def _check_sharding(model: Any, scan: list[dict], sharding: Any, notes: list[str]) -> list[CompatIssue]:
    issues: list[CompatIssue] = []
    for row in scan:
        issues += sharding_checks.check_layer_sharding(sharding, row["layer"], index=row["index"], moe_attr=row["attr"])
    if scan:
        notes += sharding_checks.check_dsa_under_tp(getattr(scan[0]["layer"], "self_attn", None))
    return _dedupe(issues)


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


def _tiny_model(config: Any, moe: dict) -> tuple[Any | None, str]:
    """A materialized tiny model of the same type (random values): the value round trip and the
    semantic checks run on it. (None, why) when transformers cannot build one (recorded as such)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    layers = moe["row"]["index"] + 1 if moe.get("row") else 1
    kwargs = build_scaled_kwargs(config, ScalePlan(num_layers=min(layers, 2), tiny=True))
    kwargs["attn_implementation"] = "eager"
    try:
        return AutoModelForCausalLM.from_config(AutoConfig.for_model(**kwargs)), ""
    except Exception as exc:  # noqa: BLE001 - no tiny twin means no value round trip (recorded as such), not a crash
        return None, " ".join(f"{type(exc).__name__}: {exc}".split())[:300]


def _random_state_dict(tiny: Any) -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    return {k: torch.randn_like(v.float()) for k, v in tiny.state_dict().items()}


def _judge_on_target(config: Any, moe: dict, strict: KeyCheck, target: dict, tiny: Any,
                     notes: list[str]) -> list[CompatIssue]:
    """Findings that stand only while the target's own code does the wrong thing (layout, semantics)."""
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
    if moe.get("layer_level") or moe.get("params") is None:
        return issues
    if tiny is None:
        notes.append("semantic checks (score placement, MoE output) not run: no tiny materialized twin")
        return issues
    report("semantic checks on a tiny twin: score placement, MoE output")
    try:
        return issues + _semantic_findings(tiny, row, target)
    except Exception as exc:  # noqa: BLE001 - the target's own code failing on the twin is reported, not hidden
        notes.append(f"semantic checks not run: the target raised on the tiny twin: {type(exc).__name__}: {exc}"[:600])
        return issues


def _semantic_findings(tiny: Any, row: dict, target: dict) -> list[CompatIssue]:
    tiny_config = tiny.config
    tiny_config.load_balance_coeff = None
    tiny_config.comm_backend = "standard"
    layer = tiny.model.layers[row["index"]]
    attr, block = hf_checks.probe_moe_site(layer)
    params = target["moe"]._probe_hf_moe_block(block, tiny_config)
    moe_config = target["moe"]._build_moe_config(params, tiny_config)
    swapped = semantic_checks.swap_like_the_target(target["moe"], layer, moe_config)
    if swapped is None:
        return []
    hidden = int(tiny_config.hidden_size)
    return [*semantic_checks.check_score_placement(block, swapped),
            *semantic_checks.check_output_contract(block, swapped, hidden=hidden),
            *semantic_checks.check_routing(block, swapped, hidden=hidden)]


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
    source: ModelSource, *, config: Any, predicted: list[int], scan: list[dict], moe: dict, issues: list[CompatIssue],
    notes: list[str], roundtrip: KeyCheck, strict: KeyCheck, timings: dict[str, float], target: dict, built: int,
) -> CompatReport:
    params = moe.get("params") or {}
    n = int(config.num_hidden_layers)
    first = predicted[0] if predicted else None
    row = moe.get("row")
    attention, attention_layers = sharding_checks.attention_layout([(r["index"], r["layer"]) for r in scan])
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
        moe_layers=predicted,
        dense_layers=[i for i in range(n) if i not in set(predicted)],
        moe_mechanism=resolve_moe_mechanism(config),
        min_layers_needed=first + 1 if first is not None else None,
        state_dict_roundtrip=roundtrip.verdict,
        strict_load=strict.verdict,
        issues=_dedupe(issues),
        roundtrip_detail=roundtrip,
        strict_load_detail=strict,
        target_probe=_jsonable(moe.get("params")),
        moe_attr=row["attr"] if row else None,
        built_layers=built,
        notes=notes + ([moe["layout_note"]] if moe.get("layout_note") else []),
        timings_s=timings,
        torchtitan_path=target["path"],
    )


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)
