"""Phase 3c step 4 on the phase side: run the stage trace, record it, and choose the hypothesis it points to.

The trace worker (``work/stage_trace.py``) compares HF and Titan stage by stage on the patched tree; this module
records every stage's max_diff as a measurement, renders the stage table as an artifact, and turns the trace
into one row of the gap table (the block's max_diff, the first diverging stage, what each side's tensors were).
``pick_hypothesis`` maps a divergence to the hypothesis patch that tests it (``gap_hypotheses``); where none
fits, the gap analysis asks the agent for one, naming the stage. ``kernel_verified`` is the skill's kernel
verification read off the trace: HF's experts kernel carrying Titan's weights gives 0.00 in Titan's block.
Every sentence here states what was measured; a cause no row shows is "not explained".
"""

from __future__ import annotations

from typing import Any

from phases.add_moe_model import gap_hypotheses
from phases.add_moe_model.work.stage_trace import (BLOCK, COMBINE, EXPERT_OUTPUTS, ROUTER_LOGITS, ROUTING,
                                                   SCORE_APPLICATION)

ROUTER_STAGES = (ROUTER_LOGITS, ROUTING)
EXPERT_STAGES = (EXPERT_OUTPUTS, SCORE_APPLICATION, COMBINE)
FP32_ROUTER_GATE = "+fp32 router gate"
EXPERTS_RUN_DTYPE = "+experts in the run's dtype"
BITS = {"float64": 64, "float32": 32, "bfloat16": 16, "float16": 16}


def record_trace(ctx: Any, trace: dict[str, Any], *, log: str) -> tuple[str, dict[str, Any]]:
    """Write the stage table, record each stage's max_diff; return (artifact name, the row's fields)."""
    name = ctx.write_artifact(f"gap_trace-{ctx.state['last_seq'] + 1}.md",
                              ctx.render("gap_trace.md.j2", trace=trace, verified=kernel_verified(trace), log=log))
    provenance = {"device": trace["device"], "versions": trace.get("versions", {}), "seed": trace["seed"],
                  "dtype": trace["dtype"], "worker": "stage_trace", "table": name}
    for row in trace["stages"]:
        if row["max_diff"] is not None:
            ctx.record_measurement(name="gap_stage_max_diff", unit="abs", samples=[row["max_diff"]],
                                   provenance=provenance, labels={"stage": row["stage"], "table": name})
    return name, row_fields(trace, table=name)


def row_fields(trace: dict[str, Any], *, table: str) -> dict[str, Any]:
    """The gap row of a trace: the block's max_diff as the trace measured it, and what the trace found."""
    block = stage(trace, BLOCK)
    return {"max_diff": block.get("max_diff"), "first_divergence": trace.get("first_divergence"),
            "kernel_verified": kernel_verified(trace), "trace": trace, "trace_table": table,
            "description": describe(trace, table=table)}


def stage(trace: dict[str, Any], name: str) -> dict[str, Any]:
    return next((row for row in trace.get("stages", []) if row["stage"] == name), {})


def fmt(value: Any) -> str:
    return f"{value:.2e}" if isinstance(value, (int, float)) else "-"


def describe(trace: dict[str, Any], *, table: str) -> str:
    """What the trace measured, in one sentence: the first divergence, or why there is none to name."""
    if trace["status"] != "traced":
        return f"stage trace {trace['status']}: {trace.get('error') or 'no reason given'} (not explained)"
    first = trace.get("first_divergence")
    block = stage(trace, BLOCK).get("max_diff")
    if first is None:
        if block:
            return (f"stage trace ({table}): no stage differs, yet the block does (max_diff {fmt(block)}): "
                    "not explained")
        return f"stage trace ({table}): every stage 0.00"
    text = f"stage trace ({table}): first divergence at {first}: {divergence_text(stage(trace, first))}"
    before = trace["stages"][:[r["stage"] for r in trace["stages"]].index(first)]
    unmeasured = [row["stage"] for row in before if row["max_diff"] is None]
    if unmeasured:
        text += f"; before it {', '.join(unmeasured)} not measured"
    elif before:
        text += "; every stage before it 0.00"
    if kernel_verified(trace):
        text += "; " + kernel_text(trace)
    return text


def divergence_text(row: dict[str, Any]) -> str:
    parts = [f"max_diff {fmt(row.get('max_diff'))}"]
    if row.get("tokens_routed_differently"):
        parts.append(f"{row['tokens_routed_differently']} tokens go to other experts")
    if row.get("hf_dtype") and row.get("titan_dtype") and row["hf_dtype"] != row["titan_dtype"]:
        parts.append(f"HF {row['hf_dtype']}, Titan {row['titan_dtype']}")
    return ", ".join(parts)


def experts_below(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """Titan's routed-experts matmuls that ran with fewer bits than the run's dtype."""
    return [r for r in trace.get("titan_matmuls_below_run_dtype", []) if "experts" in r["module"]
            and "shared" not in r["module"]]


def kernel_verified(trace: dict[str, Any]) -> bool:
    """The skill's verified kernel difference: HF's experts kernel on Titan's transferred weights reproduces HF's
    experts (0.00) and, in place of Titan's routed experts, HF's block (0.00), while Titan's own block differs,
    its first divergence lies in the experts and none of their matmuls ran below the run's dtype."""
    kernel = trace.get("kernel") or {}
    return (trace.get("status") == "traced" and bool(stage(trace, BLOCK).get("max_diff"))
            and trace.get("first_divergence") in EXPERT_STAGES and not experts_below(trace)
            and kernel.get("hf_kernel_on_titan_weights_max_diff") == 0.0
            and kernel.get("block_with_hf_kernel_max_diff") == 0.0)


def kernel_text(trace: dict[str, Any]) -> str:
    kernel = trace["kernel"]
    return (f"verified kernel difference: HF's experts kernel ({kernel.get('hf_experts_impl') or 'its own'}) on "
            "Titan's transferred weights reproduces HF's experts (0.00) and, in place of Titan's routed experts, "
            f"HF's block (0.00); Titan's own experts differ by {fmt(stage(trace, BLOCK).get('max_diff'))}")


def pick_hypothesis(trace: dict[str, Any], *, tried: set[str]) -> tuple[Any, str] | None:
    """The hypothesis patch the trace's first divergence points to, once each; None where none fits."""
    first = trace.get("first_divergence")
    row = stage(trace, first) if first else {}
    if first in ROUTER_STAGES and _bits(row.get("titan_dtype")) < _bits(row.get("hf_dtype")):
        choice = (gap_hypotheses.build_fp32_router_gate_patch, FP32_ROUTER_GATE)
    elif first in EXPERT_STAGES and experts_below(trace):
        choice = (gap_hypotheses.build_experts_run_dtype_patch, EXPERTS_RUN_DTYPE)
    else:
        return None
    return None if choice[1] in tried else choice


def _bits(dtype: str | None) -> int:
    return BITS.get(dtype or "", 0)


def ask_text(trace: dict[str, Any] | None) -> str:
    """Where the agent's hypothesis patch should look: the trace's first divergence, or that none was found."""
    if trace is None or trace.get("status") != "traced":
        return "the stage trace did not run" + (f" ({trace.get('error')})" if trace and trace.get("error") else "")
    first = trace.get("first_divergence")
    if first is None:
        return "the stage trace shows no stage diverging"
    return f"the stage trace's first divergence is {first} ({divergence_text(stage(trace, first))})"
