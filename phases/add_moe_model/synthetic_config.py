"""Phase 2 of add_moe_model: the synthetic ``_MODEL_CONFIGS`` entry (engine side, no torch).

The worker builds and validates the entry against the real config; this module writes it.
If the target ships NE (``<EXP>/.claude/skills/add_moe_model/scripts/numerical_equivalence.py``)
the entry goes into its ``_MODEL_CONFIGS`` through an AST-positioned edit that is verified to
touch nothing else; torchtitan 0.3.0 does not ship NE, so the normal path there is the
``synthetic_config.json`` artifact.
"""

from __future__ import annotations

import json

from orchestrator.phase_api import Issue, PhaseContext, PhaseResult
from phases.add_moe_model.compat import EXP
from phases.add_moe_model.config_entry import ConfigEntryError, check_only_model_configs_changed, upsert_model_config
from phases.add_moe_model.model_source import ModelSourceError, resolve_model_source
from phases.add_moe_model.records import NeEntryWritten, Probe
from phases.add_moe_model.workers import SYNTHETIC

CONFIG_KEYS = "phases/add_moe_model/work/config_fields.py"
NE_PATH = f"{EXP}/.claude/skills/add_moe_model/scripts/numerical_equivalence.py"


def run(ctx: PhaseContext) -> PhaseResult:
    """Build, check and write the synthetic entry for the probed model."""
    if "probe" not in ctx.results:
        return PhaseResult(outcome="failed", summary="no probe result: run the probe phase first")
    probe = ctx.result("probe", Probe)
    try:
        source = resolve_model_source(str(ctx.options.get("model", "")))
    except ModelSourceError as exc:
        return PhaseResult(outcome="failed", summary=str(exc))
    request = {"source": source.model_dump(mode="json"), "probe_min_layers": probe.min_layers_needed,
               "layer_kinds": [k.model_dump(mode="json") for k in probe.layer_kinds]}
    ctx.plan(1)
    answer = ctx.call(SYNTHETIC, request, label="synthetic_config")
    entry, checks = answer.entry, list(answer.checks)
    layers = {"layers": [p.model_dump(mode="json") for p in answer.layers], "layer_note": answer.layer_note}
    if checks:
        return rules_broken(entry, checks, layers=layers)
    written_to, problems = write_entry(ctx, entry)
    data = {"entry": entry, "written_to": written_to, "checks": checks + problems,
            "moe_layers_built": answer.moe_layers_built, **layers}
    if problems:
        return PhaseResult(outcome="failed", summary=f"NE edit rejected: {problems[0]}", data=data)
    return PhaseResult(outcome="passed", summary=f"{entry['model_type']} entry written to {written_to}: "
                                                 f"{answer.layer_note}", data=data)


def rules_broken(entry: dict, checks: list[str], *, layers: dict | None = None) -> PhaseResult:
    """The entry is built by orchestrator's own code, outside the experiment folder: a person's call."""
    where = (f"orchestrator: {CONFIG_KEYS} (the config names it knows) or work/scaled_config.py; "
             "or a person waives it: resume RUN --waive synthetic_rule_broken --reason TEXT")
    issues = tuple(Issue(code="synthetic_rule_broken", message=c, fix_location=where) for c in checks)
    return PhaseResult(outcome="needs_human", summary=f"synthetic entry breaks {len(checks)} rule(s)",
                       data={"entry": entry, "checks": checks, **(layers or {})}, issues=issues)


def write_entry(ctx: PhaseContext, entry: dict) -> tuple[str, list[str]]:
    """Write into NE when the target has it (AST edit, verified), else as an artifact."""
    script = ctx.target / NE_PATH
    if not script.is_file():
        return ctx.write_artifact("synthetic_config.json", json.dumps(entry, indent=2, sort_keys=True) + "\n"), []
    before = script.read_text()
    try:
        after = upsert_model_config(before, model_type=entry["model_type"], entry=entry)
    except ConfigEntryError as exc:
        return NE_PATH, [f"{NE_PATH}: {exc}"]
    problems = check_only_model_configs_changed(before, after, model_type=entry["model_type"])
    if not problems:
        script.write_text(after)
        ctx.add_record("ne_entry_written", NeEntryWritten(path=NE_PATH, model_type=entry["model_type"]))
    return NE_PATH, problems
