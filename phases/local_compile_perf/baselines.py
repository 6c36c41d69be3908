"""Step 1, baselines: trap checks first, then eager / upstream / per-layer in fresh processes.

The harness must pass the measurement-trap checks (detached inputs, accumulating grads,
unseeded state, fp32 precision) before anything is timed: a failed trap fails this phase
and nothing is baselined. Every tree is then measured at every token count by ``runs``
fresh processes, interleaved and rotated (confirm_variants_worker); each cited number is
the median of those runs. Rows that cannot exist here say why: CUDA-graph replay and peak
memory on a CPU host, the upstream tree for an HF harness (no regions), and per-layer
compile at token counts left out by ``--per-layer-tokens``.
"""

from __future__ import annotations

import os
from typing import Any

from orchestrator.phase_api import Issue, PhaseContext, PhaseResult
from phases.kit.attention import GemmRateRequest
from phases.kit.timing import is_cuda
from phases.kit.workers import GEMM_RATE
from phases.local_compile_perf import attention_floor, per_step
from phases.local_compile_perf.confirmed import build_cells, call_confirm, log_cells, record_cells
from phases.local_compile_perf.devlog import log
from phases.local_compile_perf.records import Baselines, Cell, Plan
from phases.local_compile_perf.resume import call_kept
from phases.local_compile_perf.work.measure_trees import ConfirmRequest, Variant
from phases.local_compile_perf.work.traps import TrapRequest
from phases.local_compile_perf.workers import TRAPS


def run(ctx: PhaseContext) -> PhaseResult:
    plan = ctx.result("plan", Plan)
    ctx.plan(3)  # the traps, the baselines, and the GEMM rate where the eager step has attention
    traps = call_kept(ctx, TRAPS, TrapRequest(harness=plan.harness, tokens=min(plan.tokens), device=plan.device),
                     label="traps").model_dump(mode="json")
    failed = [f for f in traps["findings"] if f["status"] != "pass"]
    log(ctx, "trap checks: " + "; ".join(f"{f['trap']} {f['status']}" for f in traps["findings"]), kind="measurement")
    if failed:
        return PhaseResult(
            outcome="failed", summary=f"baselines refused: {len(failed)} measurement trap(s) failed",
            data={"traps": traps},
            issues=tuple(Issue(code=f"trap_{f['trap']}", message=f["message"], fix_location=plan.harness)
                         for f in failed))
    answer = call_confirm(ctx, confirm_request(ctx, plan), label="baselines").model_dump(mode="json")
    rows = build_cells(answer, runs=plan.sizes.runs) + not_applicable_rows(plan)
    record_cells(ctx, rows, purpose="baseline")
    broken = [r for r in rows if r.status == "failed"]
    log_cells(ctx, rows)
    gemm_rate, attention = check_attention(ctx, plan, rows)
    load = per_step.highest_load(r.host_load for r in rows)
    ctx.write_artifact("baselines.md", ctx.render("baselines.md.j2", plan=plan, rows=rows, traps=traps,
                                                  runs=plan.sizes.runs, gpu_poll=answer["gpu_poll"],
                                                  gemm_rate=gemm_rate, attention=attention,
                                                  per_step=per_step_notes(rows, cuda=plan.cuda),
                                                  host_load=per_step.host_load_note(load, os.cpu_count())))
    data = Baselines(traps=traps, rows=tuple(r.slim() for r in rows), gpu_poll=answer["gpu_poll"],
                     orders=answer["orders"], gemm_rate=gemm_rate, attention=tuple(attention)).model_dump(mode="json")
    if broken:
        return PhaseResult(outcome="failed", summary=f"baselines: {len(broken)} cell(s) FAILED", data=data,
                           issues=tuple(Issue(code="baseline_failed", message=f"{r.variant} at {r.tokens}: "
                                              f"{r.reason}; see the worker log", fix_location=plan.harness)
                                        for r in broken))
    return PhaseResult(outcome="passed", summary=f"baselines: {sum(r.status == 'measured' for r in rows)} cells "
                                                 f"measured, {plan.sizes.runs} fresh processes each", data=data)


def check_attention(ctx: PhaseContext, plan: Plan, rows: list[Cell]) -> tuple[dict[str, Any] | None, list]:
    """The GEMM rate measured here and one attention-vs-FLOP-floor row per eager cell (none without SDPA)."""
    if not attention_floor.eager_cells_with_attention(rows):
        log(ctx, "attention vs FLOP floor: no scaled_dot_product_attention call in the eager step (eager "
                 "matmuls or another kernel): no floor", kind="measurement")
        return None, []
    rate = call_kept(ctx, GEMM_RATE, GemmRateRequest(device=plan.device), label="gemm rate").model_dump(mode="json")
    ctx.record_measurement(name="gemm_rate_tflops", unit="TFLOP/s", samples=[rate["tflops"]],
                           provenance={"command": f"{GEMM_RATE.ref} device={plan.device}",
                                       "device_name": plan.device_name, "torch": plan.torch, "seed": 0,
                                       "target_commit": ctx.base["commit"]},
                           labels={k: rate[k] for k in ("size", "reps", "seconds", "dtype", "label")})
    floors = attention_floor.floor_rows(rows, rate, cuda=is_cuda(plan.device))
    for row in floors:
        log(ctx, attention_floor.describe(row), kind="measurement")
    return rate, floors


def per_step_notes(rows: list[Cell], *, cuda: bool) -> list[str]:
    """Why a measured row's cited glue, kernel and wall medians do not add up (nothing for rows that do)."""
    return [f"{row.variant} at {row.tokens} tokens: {why}" for row in rows
            if row.status == "measured" and (why := per_step.cited_why(row.cited, cuda=cuda))]


def trees_for(plan: Plan) -> list[tuple[str, str, tuple[int, ...]]]:
    """(variant, tree, tokens) to measure: upstream only where the harness has regions."""
    trees = [("eager", "eager", plan.tokens)]
    if plan.kind != "hf":
        trees.append(("upstream", "upstream", plan.tokens))
    trees.append(("per_layer", "per_layer", plan.sizes.per_layer_tokens))
    return trees


def confirm_request(ctx: PhaseContext, plan: Plan) -> ConfirmRequest:
    variants = tuple(Variant(name=name, checkout=str(ctx.target), tree=tree, tokens=tokens)
                     for name, tree, tokens in trees_for(plan))
    return ConfirmRequest(harness=plan.harness, device=plan.device, variants=variants, runs=plan.sizes.runs,
                          timing=plan.timing)


def not_applicable_rows(plan: Plan) -> list[Cell]:
    rows = []
    if plan.kind == "hf":
        rows += [Cell(variant="upstream", tree="upstream", tokens=t, status="not_applicable",
                      reason="an HF harness has no regions: only eager vs per-layer compile") for t in plan.tokens]
    per_layer = list(plan.sizes.per_layer_tokens)
    skipped = [t for t in plan.tokens if t not in per_layer]
    rows += [Cell(variant="per_layer", tree="per_layer", tokens=t, status="not_applicable",
                  reason=f"per-layer compile measured at {per_layer} only ({plan.sizes.source}): "
                         "its cold compile per shape does not fit this host's budget") for t in skipped]
    return rows
