"""The findings' re-timing under selective activation checkpointing.

The headline rows run each layer under the harness's recipe AC mode. A recipe that trains with selective AC
recomputes the glue in the backward, which changes what a region saves; so, unless the headline already ran
under it, per-layer compile of main and the region stack are timed again with selective AC around each
layer, interleaved in fresh processes at the smallest per-layer token count (kit activation_checkpoint).
"""

from __future__ import annotations

from typing import Any

from orchestrator.phase_api import PhaseContext
from phases.local_compile_perf import per_step
from phases.local_compile_perf.confirmed import build_cells, call_confirm, log_cells, measured, record_cells
from phases.local_compile_perf.records import Plan
from phases.local_compile_perf.work.measure_trees import ConfirmRequest, Variant

RETIME_MODE = "selective"


def measure_under_ac(ctx: PhaseContext, plan: Plan, *, main: str, stack: str) -> dict[str, Any] | None:
    """{mode, tokens, per_layer_main, regions_stack} cited cells (None where a cell failed); None when the
    recipe's own mode is already selective (the headline is then under it)."""
    if plan.spec.ac_mode == RETIME_MODE:
        return None
    tokens = min(plan.sizes.per_layer_tokens)
    variants = (Variant(name="per_layer_main", checkout=main, tree="per_layer", tokens=(tokens,), ac_mode=RETIME_MODE),
                Variant(name="regions_stack", checkout=stack, tree="upstream", tokens=(tokens,), ac_mode=RETIME_MODE))
    request = ConfirmRequest(harness=plan.harness, device=plan.device, variants=variants, runs=plan.sizes.runs,
                             timing=plan.timing)
    rows = build_cells(call_confirm(ctx, request, label=f"stack under {RETIME_MODE} AC").model_dump(mode="json"),
                       runs=plan.sizes.runs)
    record_cells(ctx, rows, purpose=f"stack code under {RETIME_MODE} AC")
    log_cells(ctx, rows, prefix=f"under {RETIME_MODE} AC: ")
    cited = {name: (c.cited if (c := measured(rows, name, tokens)) else None)
             for name in ("per_layer_main", "regions_stack")}
    load = per_step.highest_load(r.host_load for r in rows)
    return {"mode": RETIME_MODE, "recipe_mode": plan.spec.ac_mode, "tokens": tokens, **cited, "host_load": load}
