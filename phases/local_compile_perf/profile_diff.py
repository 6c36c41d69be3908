"""Step 3, profile and diff: kernel families per tree from the baseline runs, and what they mean.

The baselines' first fresh process of each cell carries its kernel table (grouped by
family; counts per step next to times, since same-name kernels merge). The diff of the
upstream tree against per-layer compile is the glue a region could still take; each
family with a gap is looked up in a short symptom table taken from the skill's symptoms
list. No new measurement: this phase reads what the baselines recorded.
"""

from __future__ import annotations

from typing import Any

from orchestrator.phase_api import PhaseContext, PhaseResult
from phases.local_compile_perf import per_step
from phases.local_compile_perf.devlog import log
from phases.local_compile_perf.records import Baselines, Cell, Plan

SYMPTOMS = {
    "cat/copy": "cat/copy kernels in glue: producer + cat + consumer in one region; try both cat lowerings",
    "scatter/gather": "scatter/atomics: dispatch and combine as gathers (gather, then sum over top-k; no scatter-add); "
                      "index math on symbolic sizes: prefer_nd_tiling",
    "pointwise": "many small pointwise kernels: fuse into a region; "
                 "complex ops under compile -> real arithmetic on (real, imaginary) pairs",
    "reduction": "small reductions slow: unroll / keep their sizes static, or make them a GEMM",
    "norm": "norms apart from their consumers: one region with the next glue (norm + RoPE + cat)",
    "sort": "sorts in routing: narrow the sort keys to int16",
    "other": "unclassified kernels: read their names in the table",
}


def per_step_check(row: Cell, *, cuda: bool) -> dict[str, Any]:
    """Do the first process's family times add up to at most its kernel total, and that to about its wall?

    The families are the first fresh process's table, so its own kernel total and wall are the comparison.
    """
    families = sum(f["ms_per_step"] for f in row.families)
    check = per_step.reading(kernel=row.samples["kernel_ms"][0], wall=row.samples["wall_ms"][0], cuda=cuda,
                             parts=families)
    return {"families_ms": families, **check}


def family_ms(row: Cell) -> dict[str, float]:
    return {f["family"]: f["ms_per_step"] for f in row.families}


def diff_rows(base: Cell, other: Cell) -> list[dict[str, Any]]:
    """Per family: base ms, other ms, base - other, largest first."""
    a, b = family_ms(base), family_ms(other)
    fams = sorted(set(a) | set(b), key=lambda f: -(a.get(f, 0.0) - b.get(f, 0.0)))
    return [{"family": f, "base_ms": a.get(f, 0.0), "other_ms": b.get(f, 0.0),
             "delta_ms": a.get(f, 0.0) - b.get(f, 0.0), "symptom": SYMPTOMS.get(f, "")} for f in fams]


def run(ctx: PhaseContext) -> PhaseResult:
    rows = [r for r in ctx.result("baselines", Baselines).rows if r.status == "measured"]
    cuda = ctx.result("plan", Plan).cuda
    tables, diffs = [], []
    for tokens in sorted({r.tokens for r in rows}):
        by_variant = {r.variant: r for r in rows if r.tokens == tokens}
        tables += [{"variant": v, "tokens": tokens, "families": list(r.families),
                    "per_step": per_step_check(r, cuda=cuda)} for v, r in by_variant.items()]
        base = by_variant.get("upstream") or by_variant.get("eager")
        if base is not None and "per_layer" in by_variant:
            diffs.append({"tokens": tokens, "base": base.variant, "other": "per_layer",
                          "rows": diff_rows(base, by_variant["per_layer"])})
    glue_left = [(d["tokens"], r) for d in diffs for r in d["rows"]
                 if r["delta_ms"] > 0 and r["family"] not in ("gemm", "attention")]
    for tokens, r in glue_left[:5]:
        log(ctx, f"diff at {tokens} tokens: {r['family']} {r['base_ms']:.3f} ms vs {r['other_ms']:.3f} ms per-layer: "
                 f"{r['symptom']}", kind="measurement")
    if not diffs:
        log(ctx, "no per-layer row to diff against at any measured token count", kind="dead_end")
    for t in (t for t in tables if not t["per_step"]["holds"]):
        log(ctx, f"per-step check of {t['variant']} at {t['tokens']} tokens: {t['per_step']['why']}",
            kind="measurement")
    ctx.write_artifact("profile_diff.md", ctx.render("profile.md.j2", tables=tables, diffs=diffs))
    return PhaseResult(outcome="passed", summary=f"profile: {len(tables)} kernel tables, {len(diffs)} diff(s)",
                       data={"diffs": diffs, "glue_left": [{"tokens": t, **r} for t, r in glue_left],
                             "per_step": [{"variant": t["variant"], "tokens": t["tokens"], **t["per_step"]}
                                          for t in tables]})
