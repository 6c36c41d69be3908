"""Turn fresh-process runs into cited rows: one value = the median of 3 runs, samples kept.

A confirmation (work/measure_trees.py) answers, per variant, every fresh process with its
per-token-count results. Here each (variant, tokens) cell becomes a ``records.Cell`` whose cited
numbers are medians over the ok runs of that cell, and every one of those numbers is
recorded as a measurement with all its per-run samples, ``cited=True`` and the median it
claims (the audit recomputes it). A cell with fewer ok runs than asked is not cited: it is
a failed row with the FAILED markers' tails. Engine side: no torch.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.phase_api import PhaseContext
from phases.local_compile_perf import per_step
from phases.local_compile_perf.devlog import log
from phases.local_compile_perf.records import Cell
from phases.local_compile_perf.work.measure_trees import ConfirmRequest, ConfirmResponse
from phases.local_compile_perf.workers import CONFIRM

GLUE_EXCLUDED = ("gemm", "attention")


@dataclass(frozen=True, kw_only=True, slots=True)
class Metric:
    name: str
    unit: str
    label: str


METRICS = (
    Metric(name="wall_ms", unit="ms", label="normal launch, wall per fwd+bwd step"),
    Metric(name="replay_ms", unit="ms", label="CUDA-graph replay of the whole fwd+bwd"),
    Metric(name="kernel_ms", unit="ms", label="profiler kernel time per step"),
    Metric(name="glue_ms", unit="ms", label="profiler glue time per step (not gemm, not attention)"),
)


def call_confirm(ctx: PhaseContext, request: ConfirmRequest, *, label: str) -> ConfirmResponse:
    """The CONFIRM worker's answer to ``request``, journaled in the run's scratch dir per phase and label.

    A phase cut midway (a device call's limit) and rerun reads back the fresh processes that finished on
    this machine instead of measuring them again; the devlog says which, and the rows keep every run. A
    phase that was not cut starts a fresh journal.
    """
    from phases.local_compile_perf.resume import kept_path

    journal = kept_path(ctx, label, ".jsonl")
    if not ctx.interrupted:  # NOTE: runs are read back only into the rerun of the attempt that was cut
        journal.unlink(missing_ok=True)
    answer = ctx.call(CONFIRM, request.model_copy(update={"journal": str(journal)}), label=label)
    if answer.carried:
        total = len(request.variants) * request.runs
        log(ctx, f"{label}: {len(answer.carried)} of {total} fresh processes read back from the attempt that was cut, "
                 f"measured on this machine ({answer.machine}): {', '.join(answer.carried)}", kind="measurement")
    return answer


def glue_ms(result: dict[str, Any]) -> float:
    return sum(f["ms_per_step"] for f in result["kernels"]["families"] if f["family"] not in GLUE_EXCLUDED)


def run_values(result: dict[str, Any]) -> dict[str, float | None]:
    """The per-run value of each metric (None when the row does not apply here)."""
    graph = result["cuda_graph"]
    replay = statistics.median(graph["samples_ms"]) if graph.get("samples_ms") else None
    return {"wall_ms": result["wall_ms"], "replay_ms": replay, "kernel_ms": result["kernel_ms"],
            "glue_ms": glue_ms(result)}


def build_cells(answer: dict[str, Any], *, runs: int) -> list[Cell]:
    """One row per (variant, tokens): cited medians, per-run samples, not-applicable reasons."""
    rows = []
    for block in answer["variants"]:
        variant = block["variant"]
        for tokens in variant["tokens"]:
            rows.append(_cell(variant, tokens, block["runs"], runs=runs))
    return rows


def _cell(variant: dict[str, Any], tokens: int, outcomes: list[dict[str, Any]], *, runs: int) -> Cell:
    ok = [o for o in outcomes if o["status"] == "ok" and str(tokens) in (o["result"] or {})]
    results = [o["result"][str(tokens)] for o in ok]
    row: dict[str, Any] = {
        "variant": variant["name"], "tree": variant["tree"], "tokens": tokens, "checkout": variant["checkout"],
        "runs_ok": len(ok), "runs_asked": runs,
        "foreign_pids": sorted({p for o in outcomes for p in o["foreign_pids"]}),
        "host_load": per_step.highest_load(o.get("host_load") for o in outcomes),
        "failed": [{"index": o["index"], "returncode": o["returncode"], "log_tail": o["log_tail"][-600:]}
                   for o in outcomes if o["status"] != "ok"],
    }
    if len(ok) < runs:
        return Cell(**row, status="failed", reason=f"{runs - len(ok)} of {runs} fresh processes FAILED")
    per_run = [run_values(r) for r in results]
    samples = {m.name: [v[m.name] for v in per_run] for m in METRICS}
    cited = {name: statistics.median(vals) for name, vals in samples.items() if None not in vals}
    first = results[0]
    not_applicable = dict(first["not_applicable"])
    if "replay_ms" not in cited:
        not_applicable.setdefault("cuda_graph", first["cuda_graph"].get("reason", "no replay"))
    return Cell(**row, status="measured", samples={k: v for k, v in samples.items() if None not in v},
                cited=cited, not_applicable=not_applicable, kernel_count=first["kernel_count"],
                families=first["kernels"]["families"], regions=first["regions"], peak_gib=_peak(results),
                provenance=first["provenance"], spec=first["spec"],
                compile_ms=[r["timing"]["compile_ms"] for r in results], attention=first.get("attention"))


def _peak(results: list[dict[str, Any]]) -> float | None:
    peaks = [r["timing"]["peak_memory"].get("bytes") for r in results]
    return None if None in peaks else statistics.median(peaks) / 2**30


def record_cells(ctx: PhaseContext, rows: Sequence[Cell], *, purpose: str, cited: bool = True) -> None:
    """Record every number of ``rows`` with its samples and provenance; ``cited=False`` for rows of fewer fresh
    processes than a cited number needs (indicative, as the rewrite deltas' single runs: the audit holds every
    cited number to its 3 fresh processes)."""
    units = {m.name: m for m in METRICS}
    for row in rows:
        if row.status != "measured":
            continue
        for name, samples in row.samples.items():
            ctx.record_measurement(
                name=name, unit=units[name].unit, samples=list(samples), provenance=row.provenance or {},
                labels={"purpose": purpose, "variant": row.variant, "tree": row.tree, "tokens": row.tokens,
                        "what": units[name].label, "cited": cited, "value": row.cited[name],
                        "fresh_processes": len(samples), "foreign_pids": list(row.foreign_pids),
                        "launch": "cuda_graph_replay" if name == "replay_ms" else "normal"})


def cell(rows: Sequence[Cell], variant: str, tokens: int) -> Cell | None:
    return next((r for r in rows if r.variant == variant and r.tokens == tokens), None)


def measured(rows: Sequence[Cell], variant: str, tokens: int) -> Cell | None:
    """The cell of ``variant`` at ``tokens`` when it was measured, else None."""
    found = cell(rows, variant, tokens)
    return found if found and found.status == "measured" else None


def describe_cell(row: Cell) -> str:
    """One devlog line of a cell: its cited medians and how many fresh processes gave them."""
    if row.status != "measured":
        return f"{row.variant} at {row.tokens} tokens: {row.status} ({row.reason})"
    c = row.cited
    replay = f", replay {c['replay_ms']:.3f} ms" if "replay_ms" in c else ", replay n/a"
    return (f"{row.variant} at {row.tokens} tokens: wall {c['wall_ms']:.3f} ms{replay}, kernel "
            f"{c['kernel_ms']:.3f} ms, glue {c['glue_ms']:.3f} ms (median of {row.runs_ok} fresh processes)")


def log_cells(ctx: PhaseContext, rows: Sequence[Cell], *, prefix: str = "") -> None:
    """One devlog measurement entry per cell, right after its fresh processes."""
    for row in rows:
        log(ctx, f"{prefix}{describe_cell(row)}", kind="measurement")
