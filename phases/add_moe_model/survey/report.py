"""The survey's reports: survey.json, SURVEY.md and survey.html (table + KL plot).

SURVEY.md follows MODEL_COMPATIBILITY.md's summary table (model, type, status, KL, ...).
survey.html is one static page: the same table and a plot of the bf16 KL per model on a
log axis with the PASS and WARN thresholds drawn (matplotlib, embedded as inline SVG: no
script, no network). Only these files are written, each atomically.
"""

from __future__ import annotations

import html
import io
import json
from pathlib import Path
from typing import Any

from orchestrator.trail.store import atomic_write
from phases.add_moe_model.work.kl import PASS_KL, WARN_KL

COLUMNS = ("Model type", "Outcome", "Tier", "KL (bf16)", "KL fp64", "Spread", "KL (fp32 diag)", "Run", "Reasons")


def write_reports(survey: Any, opts: Any) -> dict[str, Path]:
    out = opts.out
    body = {"transformers": survey.transformers, "target": opts.target, "device": opts.device,
            "seconds": survey.seconds, "warm_import_s": survey.warm_import_s, "counts": survey.counts, "in_flight": {},
            "rows": [r.model_dump() for r in survey.rows]}
    paths = {"survey.json": out / "survey.json", "SURVEY.md": out / "SURVEY.md", "survey.html": out / "survey.html"}
    atomic_write(paths["survey.json"], json.dumps(body, indent=2, sort_keys=True).encode() + b"\n")
    atomic_write(paths["SURVEY.md"], render_markdown(survey, opts).encode())
    atomic_write(paths["survey.html"], render_html(survey, opts).encode())
    return paths


def table_cells(row: Any) -> list[str]:
    n = row.numerics or {}
    return [row.model_type, row.outcome, n.get("tier_shown") or "-", _sci(n.get("kl")), _sci(n.get("kl_fp64")),
            _sci(n.get("spread")), _sci(n.get("fp32_kl")), row.run_id or "-", "; ".join(row.reasons)]


def _sci(value: Any) -> str:
    return f"{value:.2e}" if isinstance(value, (int, float)) else "-"


def render_markdown(survey: Any, opts: Any) -> str:
    counts = ", ".join(f"{k} {v}" for k, v in survey.counts.items())
    lines = [f"# add-moe-model survey ({opts.target} target, transformers {survey.transformers}, "
             f"device {opts.device})", "",
             f"{len(survey.rows)} model types: {counts}; this invocation {survey.seconds:.0f} s.", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in survey.rows:
        cells = [c.replace("|", "\\|").replace("\n", " ") for c in table_cells(row)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def kl_plot_svg(rows: list[Any]) -> str:
    """bf16 KL per model (|KL|, log axis), spread as error bars, PASS/WARN thresholds as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [r for r in rows if r.numerics and isinstance(r.numerics.get("kl"), (int, float))]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.32 * len(measured) + 2), 4.2))
    names = [r.model_type for r in measured]
    values = [max(abs(r.numerics["kl"]), 1e-12) for r in measured]
    spread = [r.numerics.get("spread") or 0.0 for r in measured]
    colors = ["#2b8a3e" if r.numerics["tier"] == "PASS" else "#e67700" if r.numerics["tier"] == "WARN"
              else "#c92a2a" for r in measured]
    ax.bar(range(len(values)), values, color=colors, yerr=spread, capsize=2)
    ax.axhline(PASS_KL, color="#2b8a3e", linestyle="--", label="PASS < 1e-6")
    ax.axhline(WARN_KL, color="#c92a2a", linestyle="--", label="WARN < 1e-3")
    ax.set_yscale("log")
    ax.set_ylabel("|KL| bf16 (nats)")
    ax.set_xticks(range(len(names)), names, rotation=70, ha="right", fontsize=7)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title("KL per model (bf16 verdict; bars: one-ulp spread)")
    fig.tight_layout()
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg")
    plt.close(fig)
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def render_html(survey: Any, opts: Any) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = "".join(f'<tr class="row {html.escape(r.outcome)}">'
                   + "".join(f"<td>{html.escape(c)}</td>" for c in table_cells(r)) + "</tr>\n" for r in survey.rows)
    counts = ", ".join(f"{k} {v}" for k, v in survey.counts.items())
    title = f"add-moe-model survey: {opts.target} target, transformers {survey.transformers}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; }}
table {{ border-collapse: collapse; font-size: 13px; }}
td, th {{ border: 1px solid #ccc; padding: 3px 6px; vertical-align: top; }}
tr.clean td:nth-child(2) {{ color: #2b8a3e; }} tr.error td:nth-child(2), tr.fail td:nth-child(2) {{ color: #c92a2a; }}
tr.needs_agent td:nth-child(2), tr.needs_human td:nth-child(2) {{ color: #e67700; }}
</style></head>
<body><h1>{html.escape(title)}</h1>
<p id="counts">{len(survey.rows)} model types: {html.escape(counts)}; this invocation {survey.seconds:.0f} s; device
{html.escape(opts.device)}</p>
<figure id="kl-plot">{kl_plot_svg(survey.rows)}</figure>
<table id="survey"><thead><tr>{head}</tr></thead><tbody>
{body}</tbody></table></body></html>
"""
