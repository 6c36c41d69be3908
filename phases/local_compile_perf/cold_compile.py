"""Cold compile seconds per region of the stack, for the findings.

Each region the stack enables, and per-layer compile beside it, is compiled in its own fresh process with
``TORCHINDUCTOR_FORCE_DISABLE_CACHES=1`` (no FX graph, autotune or kernel cache from an earlier process), at
the smallest per-layer token count. Its cold compile is the first call (compile + one fwd+bwd) less a timed
step: what a user pays on the first step of a fresh job. These runs time their steps only (no kernel profile,
no CUDA-graph replay: neither enters the number).
"""

from __future__ import annotations

import statistics
from typing import Any

from orchestrator.phase_api import PhaseContext
from phases.local_compile_perf.devlog import log
from phases.local_compile_perf.records import Plan
from phases.local_compile_perf.work.measure_trees import ConfirmRequest, Variant
from phases.local_compile_perf.confirmed import call_confirm

COLD = {"TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}


def measure_cold_compile(ctx: PhaseContext, plan: Plan, checkout: str, regions: tuple[str, ...]) -> dict[str, Any]:
    """{tokens, env, rows: [{name, tree, status, compile_s, first_call_ms, step_ms, reason}]} for ``checkout``."""
    tokens = min(plan.sizes.per_layer_tokens)
    trees = [(f"cold {r}", f"regions:{r}") for r in regions] + [("cold per_layer", "per_layer")]
    variants = tuple(Variant(name=name, checkout=checkout, tree=tree, tokens=(tokens,), env=COLD, lean=True)
                     for name, tree in trees)
    timing = plan.timing.model_copy(update={"warmup": 1, "iters": 2, "profile_steps": 1})
    request = ConfirmRequest(harness=plan.harness, device=plan.device, variants=variants, runs=1, timing=timing)
    answer = call_confirm(ctx, request, label="cold compile").model_dump(mode="json")
    rows = [cold_row(block, tokens) for block in answer["variants"]]
    for row in rows:
        log(ctx, describe_cold(row, tokens), kind="measurement")
    return {"tokens": tokens, "env": COLD, "rows": rows}


def cold_row(block: dict[str, Any], tokens: int) -> dict[str, Any]:
    variant, (run,) = block["variant"], block["runs"]
    row = {"name": variant["name"].removeprefix("cold "), "tree": variant["tree"], "host_load": run.get("host_load")}
    result = (run.get("result") or {}).get(str(tokens))
    if run["status"] != "ok" or result is None or result["timing"]["compile_ms"] is None:
        last = [line.strip() for line in run["log_tail"].splitlines() if line.strip()]
        error = next((line for line in reversed(last) if "Error" in line or "FAILED" in line), last[-1] if last else "")
        return {**row, "status": "failed", "reason": f"fresh process FAILED: {error[-300:]}"}
    first, step = result["timing"]["compile_ms"], statistics.median(result["timing"]["samples_ms"])
    return {**row, "status": "measured", "compile_s": max(first - step, 0.0) / 1e3, "first_call_ms": first,
            "step_ms": step}


def describe_cold(row: dict[str, Any], tokens: int) -> str:
    """One devlog line of a cold_row."""
    where = f"cold compile of {row['name']} ({row['tree']}) at {tokens} tokens"
    if row["status"] != "measured":
        return f"{where}: FAILED in its fresh process (see the worker log)"
    return (f"{where}: {row['compile_s']:.1f} s (first call {row['first_call_ms']:.0f} ms less a step of "
            f"{row['step_ms']:.1f} ms; 1 fresh process, Inductor caches off)")
