"""Step 2, ideal times: bandwidth once per device, then measured / ideal / gap per glue op.

The denominator is the copy bandwidth measured on this device (kit bandwidth; on a CPU
host a host-memcpy number that says so). Each glue op (a region's call signature) is timed
alone in eager at the largest token count, forward and forward+backward, and its ideal is
its boundary bytes over that bandwidth. Beside each op, its best-known kernel (work/best_known.py:
Liger-Kernel's, on CUDA) is timed on the same arguments, or the row says why it was not. Each op's
measured samples are recorded as measurements.
"""

from __future__ import annotations

import statistics
from typing import Any

from orchestrator.phase_api import PhaseContext, PhaseResult
from phases.kit.bandwidth import BandwidthRequest
from phases.kit.workers import BANDWIDTH
from phases.local_compile_perf.devlog import log
from phases.local_compile_perf.records import Plan
from phases.local_compile_perf.resume import call_kept
from phases.local_compile_perf.work.best_known import describe, per_call_ms
from phases.local_compile_perf.work.glue import GlueRequest
from phases.local_compile_perf.workers import GLUE


def tb_per_s(tbs: float) -> str:
    """A bandwidth as every report prints it (3 significant digits: a host's 0.00712 is not 0.01)."""
    return f"{tbs:.3g} TB/s"


def run(ctx: PhaseContext) -> PhaseResult:
    plan = ctx.result("plan", Plan)
    ctx.plan(1 if plan.kind == "hf" else 2)  # the bandwidth, and the glue ops of a torchtitan tree
    bw = call_kept(ctx, BANDWIDTH, BandwidthRequest(device=plan.device), label="bandwidth").model_dump(mode="json")
    ctx.record_measurement(name="bandwidth_tbs", unit="TB/s", samples=[bw["tbs"]],
                           provenance={"command": f"{BANDWIDTH.ref} device={plan.device}",
                                       "device_name": plan.device_name,
                                       "torch": plan.torch, "seed": 0, "target_commit": ctx.base["commit"]},
                           labels={"kind": bw["kind"], "label": bw["label"], "nbytes": bw["nbytes"],
                                   "copies": bw["copies"], "seconds": bw["seconds"]})
    log(ctx, f"bandwidth {tb_per_s(bw['tbs'])} ({bw['label']}, {bw['nbytes']} B x {bw['copies']} copies)",
        kind="measurement")
    tokens = max(plan.tokens)
    if plan.kind == "hf":
        rows: list[dict[str, Any]] = []
        glue = {"ops": [], "regions_found": [], "tokens": tokens}
    else:
        timing = plan.timing.model_copy(update={"warmup": min(plan.timing.warmup, 3)})
        request = GlueRequest(harness=plan.harness, tokens=tokens, device=plan.device, timing=timing)
        glue = call_kept(ctx, GLUE, request, label="glue ops").model_dump(mode="json")
        rows = build_gap_rows(glue["ops"], bandwidth_tbs=bw["tbs"])
        for op, row in zip(glue["ops"], rows):
            per_call = {"op": op["op"], "tokens": tokens, "per": "call"}
            ctx.record_measurement(name="glue_op_fwd_ms", unit="ms", samples=list(op["fwd_ms"]),
                                   provenance=glue["provenance"], labels=per_call)
            if op["fwdbwd_ms"]:
                ctx.record_measurement(name="glue_op_fwdbwd_ms", unit="ms", samples=list(op["fwdbwd_ms"]),
                                       provenance=glue["provenance"], labels=per_call)
            log(ctx, f"glue op {row['op']}: measured {row['measured_ms']:.4f} ms/step, ideal {row['ideal_ms']:.4f} "
                     f"ms/step ({row['calls_per_step']} call(s), {row['bytes']} B)", kind="measurement")
    ctx.write_artifact("ideal_times.md", ctx.render("ideal.md.j2", bandwidth=bw, rows=rows, tokens=tokens,
                                                    device_name=plan.device_name))
    return PhaseResult(outcome="passed",
                       summary=f"ideal times: {tb_per_s(bw['tbs'])}, {len(rows)} glue op(s) at {tokens} tokens",
                       data={"bandwidth": bw, "tokens": tokens, "rows": rows, "regions_found": glue["regions_found"],
                             "eager_step": glue.get("eager_step")})


def build_gap_rows(ops: list[dict[str, Any]], *, bandwidth_tbs: float) -> list[dict[str, Any]]:
    """One fwd+bwd row per glue op, per step (per-call medians x calls): measured, ideal, gap."""
    from phases.kit.ideal import ideal_ms

    rows = []
    for op in ops:
        fwd = statistics.median(op["fwd_ms"])
        total = statistics.median(op["fwdbwd_ms"]) if op["fwdbwd_ms"] else fwd
        calls = op["calls_per_step"]
        nbytes = op["fwd_bytes"] + (op["bwd_bytes"] if op["fwdbwd_ms"] else 0)
        ideal = ideal_ms(nbytes, bandwidth_tbs) * calls
        best = per_call_ms(op.get("best_known"), device_time=False)
        rows.append({"op": op["op"], "region": op["region"], "calls_per_step": calls, "shapes": op["shapes"],
                     "fwd_ms": fwd * calls, "bwd_ms": max(total - fwd, 0.0) * calls, "measured_ms": total * calls,
                     "ideal_ms": ideal, "gap_ms": total * calls - ideal, "bytes": nbytes * calls,
                     "eager_bytes": sum(op["eager_bytes"].values()) * calls,
                     "best_known_ms": best * calls if best is not None else None,
                     "best_known": describe(op.get("best_known")), "noise": noise_of(op)})
    return rows


NOISY_RATIO = 3.0
"""Samples of one op timed alone whose slowest is this many times its fastest were disturbed (a shared host)."""


def noise_of(op: dict[str, Any]) -> str:
    """Why an op's per-call samples cannot be read as its cost ("" when they can)."""
    fwd, total = op["fwd_ms"], op["fwdbwd_ms"] or op["fwd_ms"]
    if op["fwdbwd_ms"] and statistics.median(fwd) > statistics.median(total):
        return (f"its forward ({statistics.median(fwd):.4f} ms) took longer than its forward+backward "
                f"({statistics.median(total):.4f} ms): the samples were disturbed")
    if max(total) > NOISY_RATIO * min(total):
        return f"samples {min(total):.4f}..{max(total):.4f} ms per call, the slowest {max(total) / min(total):.0f}x " \
               "the fastest"
    return ""
