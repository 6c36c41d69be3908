"""Phase 5: MODEL_COMPATIBILITY.md in the experiment folder, from recorded values only.

The summary row, the architecture section, the parallelism row and (when the probe found
something only core can fix) a core-changes entry are rendered from templates with values
taken from the trail (probe report, numerics verdict, parallelism results). Re-running
replaces the model's rows and section instead of adding them again; a missing file is
created with the same four sections.
"""

from __future__ import annotations

from typing import Any

from orchestrator.phase_api import PhaseContext, PhaseResult
from phases.add_moe_model import markdown_doc as md
from phases.add_moe_model.workspace import EXP

DOC = EXP + "MODEL_COMPATIBILITY.md"


def run(ctx: PhaseContext) -> PhaseResult:
    values = collect_values(ctx.results, model_id=ctx.options["model_id"])
    path = ctx.target / DOC
    text = path.read_text() if path.is_file() else ctx.render("compat_doc_skeleton.md.j2")
    text = update_doc(text, values, render=ctx.render)
    path.write_text(text)
    ctx.write_artifact("MODEL_COMPATIBILITY.md", text)
    return PhaseResult(outcome="passed", summary=f"{DOC}: {values['name']} row, section and parallelism row written",
                       data={"path": DOC, "values": values})


def collect_values(results: dict[str, Any], *, model_id: str) -> dict[str, Any]:
    probe, verdict = results["probe"], results["numerics"]["verdict"]
    parallel = results.get("parallelism", {})
    rows = {r["config"]: r for r in parallel.get("rows", [])}
    build = parallel.get("build_check", [])
    core = [i for i in probe.get("issues", []) if i.get("severity") in ("core", "blocker")]
    return {
        "name": model_id.split("/")[-1].removeprefix("type:"), "model_type": probe["model_type"],
        "status": verdict["status"], "kl": verdict["kl"], "max_diff": verdict["max_diff"],
        "cos_sim": verdict["cos_sim"], "roundtrip": verdict["roundtrip"]["status"],
        "fsdp": " / ".join(row_verdict(rows.get(c)) for c in ("FSDP-1gpu", "FSDP")),
        "fsdp_ep": row_verdict(rows.get("FSDP+EP")),
        "build_check": "/".join(f"{r['world_size']}:{r['status']}" for r in build) or "not run",
        "probe": probe, "core_issues": core, "gap_rows": results.get("gap_analysis", {}).get("rows", []),
    }


def row_verdict(row: dict[str, Any] | None) -> str:
    """"PASS (1 GPU)", "FAIL (2 GPUs, torch)", "UNRUN (1 GPU)" or "not run"."""
    if row is None:
        return "not run"
    gpus = f"{row['world_size']} GPU" + ("s" if row["world_size"] > 1 else "")
    cause = ", torch" if row["status"] == "FAIL" and row["root_cause"].startswith("torch") else ""
    return f"{row['status']} ({gpus}{cause})"


def update_doc(text: str, values: dict[str, Any], *, render: Any) -> str:
    key = values["model_type"]
    text = md.upsert_table_row(text, section="Numerical Equivalence Summary", key_column=1, key=key,
                               row=render("compat_summary_row.md.j2", v=values).strip())
    text = md.upsert_subsection(text, section="Architectural Differences per Model",
                                heading=f"### {values['name']} ({key})",
                                body=render("compat_arch_section.md.j2", v=values))
    text = md.upsert_table_row(text, section="Parallelism Support", key_column=0, key=values["name"],
                               row=render("compat_parallel_row.md.j2", v=values).strip())
    if values["core_issues"]:
        text = md.upsert_subsection(text, section="Core Changes Needed for Full Support",
                                    heading=f"### {values['name']} ({key})",
                                    body=render("compat_core_section.md.j2", v=values))
    return text
