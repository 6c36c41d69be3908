"""Phase 5: MODEL_COMPATIBILITY.md in the experiment folder, from recorded values only.

The summary row, the architecture section, the parallelism row and (only when the probe found something
only core can fix) a core-changes entry are rendered from templates with values taken from the trail
(probe report, synthetic entry, numerics verdict, gap analysis, parallelism results), each naming the
event that recorded it (``cited``). Re-running replaces the model's rows and sections instead of adding
them again, and drops a core-changes entry the model no longer needs; a missing file is created with
the sections that have content (no empty heading). A folder that differs from what numerics measured is
not documented: the run goes back to numerics first (``measured_tree``).
"""

from __future__ import annotations

from typing import Any

from orchestrator.errors import UsageError
from orchestrator.phase_api import PhaseContext, PhaseResult
from phases.add_moe_model import markdown_doc as md
from phases.add_moe_model.caveats import caveats
from phases.add_moe_model.cited import EVENT_TYPES, Cited
from phases.add_moe_model.layer_kinds_text import layer_kind_lines
from phases.add_moe_model.layer_table import layer_kind_rows
from phases.add_moe_model.measured_tree import DOC, check_measured
from phases.add_moe_model.model_numbers import real_numbers, synthetic_numbers
from phases.add_moe_model.model_source import model_name
from phases.add_moe_model.not_clean import not_clean_rows, residual_cause, sci
from phases.add_moe_model.records import Results, TorchrunRow

PHASES_CITED = ("probe", "synthetic_config", "numerics", "gap_analysis", "parallelism")
GAP_ROWS_ABOVE = "the gap-analysis rows are under Differences from Titan above"


def run(ctx: PhaseContext) -> PhaseResult:
    stale = check_measured(ctx, phase="compat_doc")
    if stale is not None:
        return stale
    cited = Cited.from_events(ctx.run_id, ctx.events(*EVENT_TYPES))
    values = collect_values(Results.model_validate(ctx.results), options=ctx.options, cited=cited)
    path = ctx.target / DOC
    text = path.read_text() if path.is_file() else ctx.render("compat_doc_skeleton.md.j2")
    text = update_doc(text, values, render=ctx.render)
    path.write_text(text)
    ctx.write_artifact("MODEL_COMPATIBILITY.md", text)
    return PhaseResult(outcome="passed", summary=f"{DOC}: {values['name']} row, section and parallelism row written",
                       data={"path": DOC, "values": values})


def collect_values(results: Results, *, options: dict[str, Any], cited: Cited) -> dict[str, Any]:
    """The doc's values (JSON: they are also the phase's data) from the typed results of the run."""
    probe, numerics = results.probe, results.numerics
    if probe is None or numerics is None:
        raise UsageError("compat_doc: the run has no probe or numerics result; those phases come first")
    verdict = numerics.verdict
    parallel = results.parallelism
    rows = {r.config: r for r in (parallel.rows if parallel else ())}
    build = parallel.build_check if parallel else ()
    core = [i.model_dump(mode="json") for i in probe.issues if i.severity in ("core", "blocker")]
    real = real_numbers(results, options, cited)
    return {
        "name": model_name(options), "model_type": probe.model_type, "run_id": cited.run_id,
        "cited": {phase: cited.phase(phase) for phase in PHASES_CITED},
        "status": verdict.status, "kl": verdict.kl, "max_diff": verdict.max_diff,
        "cos_sim": verdict.cos_sim, "roundtrip": verdict.roundtrip.status if verdict.roundtrip else None,
        "fsdp": " / ".join(row_verdict(rows.get(c)) for c in ("FSDP-1gpu", "FSDP")),
        "fsdp_ep": row_verdict(rows.get("FSDP+EP")),
        "torchrun": ", ".join(f"{config} {row_verdict(row)}" for config, row in rows.items()) or "not run",
        "caveats": caveats(results),
        "not_clean": [row.line(detail_elsewhere=GAP_ROWS_ABOVE) for row in not_clean_rows(results, cited)],
        "build_check": "/".join(f"{r.world_size}:{r.status}" for r in build) or "not run",
        "unsupported_layouts": [f"world {r.world_size} (tp={r.tp}, ep={r.ep}): {r.error or ''}".strip()
                                for r in build if r.status == "UNSUPPORTED"],
        "pretrained": numerics.pretrained.model_dump(mode="json", exclude_unset=True) if numerics.pretrained else None,
        "probe": probe.model_dump(mode="json", exclude_unset=True), "core_issues": core,
        "synthetic": synthetic_numbers(results, cited).as_data(), "real": real.as_data() if real else None,
        "differences": differences(results, cited), "layer_kinds": layer_kind_rows(results),
        "layer_kind_lines": layer_kind_lines(results, cited),
    }


def differences(results: Results, cited: Cited) -> str:
    """The "Differences from Titan" bullet: the bf16 gap and its cause, as far as a record shows one."""
    assert results.numerics is not None
    verdict = results.numerics.verdict
    gap = f"bf16 max_diff {sci(verdict.max_diff)}, KL {sci(verdict.kl)} ({cited.phase('numerics')})"
    if results.gap_analysis is None:
        return f"{gap}; no gap analysis ran (the skill runs it on WARN and FAIL; numerics {verdict.status})"
    return f"{gap}; its cause: {residual_cause(results.gap_analysis, cited).text()}"


def row_verdict(row: TorchrunRow | None) -> str:
    """"PASS (1 GPU)", "FAIL (2 GPUs, torch)", "UNRUN (1 GPU)" or "not run"."""
    if row is None:
        return "not run"
    gpus = f"{row.world_size} GPU" + ("s" if row.world_size > 1 else "")
    cause = ", torch" if row.status == "FAIL" and row.root_cause.startswith("torch") else ""
    return f"{row.status} ({gpus}{cause})"


def update_doc(text: str, values: dict[str, Any], *, render: Any) -> str:
    """Add or replace this model's rows and sections; every other row and section stays as it was.

    A document that already lists the model (the target's own MODEL_COMPATIBILITY.md) keeps its
    names for it: the summary row's model name, the section heading ending in ``(model_type)`` and
    the parallelism row whose name matches, so the model is replaced, not listed twice. The core
    changes section holds an entry only while the probe reports a core finding: a heading with
    nothing under it is never written.
    """
    key = values["model_type"]
    values = {**values, "name": existing_name(text, key) or values["name"]}
    text = md.upsert_table_row(text, section=SUMMARY, key_column=1, key=key,
                               row=render("compat_summary_row.md.j2", v=values).strip())
    heading = md.find_heading(text, section=ARCH, suffix=f"({key})") or f"### {values['name']} ({key})"
    text = md.upsert_subsection(text, section=ARCH, heading=heading,
                                body=render("compat_arch_section.md.j2", v=values))
    text = upsert_parallel_row(text, values, render=render)
    return update_core_entry(text, values, render=render)


def update_core_entry(text: str, values: dict[str, Any], *, render: Any) -> str:
    """The model's core-changes entry when it has core findings; otherwise none, and no empty section."""
    key = values["model_type"]
    if values["core_issues"] and not md.has_section(text, CORE):
        text = md.append_section(text, CORE)
    if not md.has_section(text, CORE):
        return text
    heading = md.find_heading(text, section=CORE, suffix=f"({key})") or f"### {values['name']} ({key})"
    if values["core_issues"]:
        return md.upsert_subsection(text, section=CORE, heading=heading,
                                    body=render("compat_core_section.md.j2", v=values))
    return md.drop_empty_section(md.remove_subsection(text, section=CORE, heading=heading), CORE)


SUMMARY, ARCH, PARALLEL, CORE = ("Numerical Equivalence Summary", "Architectural Differences per Model",
                                 "Parallelism Support", "Core Changes Needed for Full Support")


def measured(cell: str) -> bool:
    """A torchrun cell with a PASS or FAIL in it ("UNRUN (1 GPU) / not run" is not)."""
    return any(part.strip().startswith(("PASS", "FAIL")) for part in cell.split(" / "))


def existing_name(text: str, model_type: str) -> str | None:
    _, rows = md.table(text, section=SUMMARY)
    names = [cells[0] for cells in rows if len(cells) > 1 and cells[1] == model_type]
    return names[0] if len(names) == 1 else None


def upsert_parallel_row(text: str, values: dict[str, Any], *, render: Any) -> str:
    """The row in the table's own columns; a torchrun cell not measured here keeps the row's earlier value."""
    header, rows = md.table(text, section=PARALLEL)
    ours = md._cells(render("compat_parallel_row.md.j2", v=values).strip())
    match = matching_row(rows, values)
    if match is not None:
        ours[0] = match[0]
        ours[1:3] = [new if measured(new) else old for new, old in zip(ours[1:3], match[1:3])]
    width = len(header) or len(ours)
    row = "| " + " | ".join(ours[:width] + [""] * (width - len(ours))) + " |"
    return md.upsert_table_row(text, section=PARALLEL, key_column=0, key=ours[0], row=row)


def matching_row(rows: list[list[str]], values: dict[str, Any]) -> list[str] | None:
    """The one row named like the model (``Qwen3 MoE`` for qwen3_moe, ``Mixtral`` for Mixtral-8x7B)."""
    keys = {_norm(values["name"]), _norm(values["model_type"])}
    found = [cells for cells in rows if cells and _names_match(_norm(cells[0]), keys)]
    return found[0] if len(found) == 1 else None


def _names_match(cell: str, keys: set[str]) -> bool:
    return any(cell == k or (len(cell) >= 5 and (k.startswith(cell) or cell.startswith(k) and len(k) >= 5))
               for k in keys)


def _norm(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


