"""The stack's own code, measured once the stack is complete (for the findings).

Per-layer compile is a baseline, not a ceiling, and regions on rewritten code against
per-layer compile of main mixes two effects: the rewrites and the region boundaries. So
the final stack tip is measured interleaved in fresh processes at the per-layer token
counts beside main's upstream regions and per-layer compile of main: the region stack, and
per-layer compile of the stack's own (rewritten) code. These rows, taken in one session,
are the findings' headline (the baselines phase's rows are another session's). Its glue
ops are then timed as the stack runs them (compiled where a region is enabled) against
their ideal times, and each op still far from its ideal gets what blocks it: the traffic the eager ops move against the
boundary bytes, whether it is compiled at all, and the agent's ``blocker:`` notes.
Each region's cold compile is timed beside (cold_compile.py), and the stack again under selective
activation checkpointing (ac_retime.py). Measured once per stack tip (record
``stack_code``); a re-run of findings reuses it.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable

from orchestrator.phase_api import PhaseContext
from phases.kit.ideal import ideal_ms
from phases.local_compile_perf.ac_retime import RETIME_MODE, measure_under_ac
from phases.local_compile_perf.candidates import in_checkout
from phases.local_compile_perf.cold_compile import measure_cold_compile
from phases.local_compile_perf.confirmed import build_cells, call_confirm, log_cells, measured, record_cells
from phases.local_compile_perf.devlog import log
from phases.local_compile_perf.records import Cell, Plan
from phases.local_compile_perf.results import StackCode, StackCodePart
from phases.local_compile_perf.stack import add_detached_worktree, recipe_regions, remove_worktree
from phases.local_compile_perf.work.best_known import describe, per_call_ms
from phases.local_compile_perf.work.glue import GlueRequest
from phases.local_compile_perf.work.measure_trees import ConfirmRequest, Variant
from phases.local_compile_perf.workers import GLUE

REACHED_RATIO = 1.5
"""An op within this factor of its ideal time counts as reached."""
FLOOR_FACTOR = 3.0
"""An op whose call costs under this many compiled no-op calls is set by call overhead."""
TREES = (("upstream_main", "main", "upstream"), ("per_layer_main", "main", "per_layer"),
         ("regions_stack", "stack", "upstream"), ("per_layer_stack", "stack", "per_layer"))
"""Measured side by side (interleaved fresh processes): the findings' headline compares these rows only."""


PARTS = ("cells", "glue", "cold_compile", "under_ac")
"""The stack code's measurements, one worker call each (``under_ac`` none where the recipe's AC is already it)."""


def stack_code_calls_left(ctx: PhaseContext, plan: Plan, tip: str) -> int:
    """How many of ``tip``'s stack-code measurements no attempt has recorded yet (findings' progress total)."""
    if any(r.commit == tip for r in ctx.records(StackCode)):
        return 0
    recorded = {p.part for p in ctx.records(StackCodePart) if p.commit == tip}
    calling = [part for part in PARTS if part != "under_ac" or plan.spec.ac_mode != RETIME_MODE]
    return len([part for part in calling if part not in recorded])


def measure_stack_code(ctx: PhaseContext, plan: Plan, tip: str, bandwidth_tbs: float) -> dict[str, Any]:
    """The ``stack_code`` record of ``tip`` (measured now unless recorded already).

    Each of its four measurements is recorded as it finishes (``stack_code_part``): together they
    can outlast one sitting (a device call's limit), and a rerun measures only what is missing.
    """
    done = [r for r in ctx.records(StackCode) if r.commit == tip]
    if done:
        return done[-1].model_dump(mode="json")
    parts = {p.part: p.data for p in ctx.records(StackCodePart) if p.commit == tip}
    if parts:
        log(ctx, f"stack code of {tip[:10]}: {', '.join(parts)} recorded by an earlier attempt, read back; measuring "
                 "what is missing", kind="measurement")

    def once(part: str, measure: Callable[[], Any]) -> Any:
        if part not in parts:
            parts[part] = measure()
            ctx.add_record("stack_code_part", {"commit": tip, "part": part, "data": parts[part]})
        return parts[part]

    path = add_detached_worktree(ctx.target, tip, ctx.scratch_dir / "worktrees" / f"stack-code-{tip[:10]}")
    regions = recipe_regions(path)
    try:
        rows = [Cell.model_validate(c) for c in once("cells", lambda: measure_cells(ctx, plan, str(path)))]
        answer = once("glue", lambda: measure_glue_ops(ctx, plan, str(path), regions, bandwidth_tbs))
        cold = once("cold_compile", lambda: measure_cold_compile(ctx, plan, str(path), regions))
        under_ac = once("under_ac", lambda: measure_under_ac(ctx, plan, main=str(ctx.target), stack=str(path)))
    finally:
        remove_worktree(ctx.target, path)
    blockers = [n["text"] for n in ctx.notes() if n["text"].startswith("blocker:")]
    floor = answer["call_floor_ms"]
    ops = [judge_op(op, bandwidth_tbs, blockers, floor_ms=floor) for op in answer["ops"]]
    tokens = plan.sizes.per_layer_tokens
    record = {"commit": tip, "tokens": list(tokens), "regions": list(regions),
              "rows": [r.model_dump(mode="json") for r in rows],
              "per_tokens": [compare_trees(rows, t, names=[n for n, _w, _t in trees(plan)]) for t in tokens],
              "glue_tokens": max(plan.tokens),
              "call_floor_ms": floor, "ops": ops, "cold_compile": cold,
              "under_ac": under_ac}
    ctx.add_record("stack_code", record)
    return record


def trees(plan: Plan) -> tuple[tuple[str, str, str], ...]:
    """TREES, less per-layer compile of the stack's code where the run's --per-layer-stack no leaves it out."""
    return tuple(t for t in TREES if plan.per_layer_stack or t[0] != "per_layer_stack")


def measure_cells(ctx: PhaseContext, plan: Plan, stack: str) -> list[dict[str, Any]]:
    """The trees interleaved in fresh processes at the per-layer token counts (slim cells)."""
    checkouts = {"main": str(ctx.target), "stack": stack}
    variants = tuple(Variant(name=name, checkout=checkouts[where], tree=tree, tokens=plan.sizes.per_layer_tokens)
                     for name, where, tree in trees(plan))
    request = ConfirmRequest(harness=plan.harness, device=plan.device, variants=variants, runs=plan.sizes.runs,
                             timing=plan.timing)
    rows = build_cells(call_confirm(ctx, request, label="stack code").model_dump(mode="json"), runs=plan.sizes.runs)
    record_cells(ctx, rows, purpose="stack code")
    log_cells(ctx, rows, prefix="stack code: ")
    return [r.slim().model_dump(mode="json") for r in rows]


def measure_glue_ops(ctx: PhaseContext, plan: Plan, stack: str, regions: tuple[str, ...],
                     bandwidth_tbs: float) -> dict[str, Any]:
    """The stack's glue ops as it runs them, each timed alone at the largest token count (the GLUE worker's answer)."""
    glue = GlueRequest(harness=plan.harness, device=plan.device, tokens=max(plan.tokens), regions=regions,
                       timing=plan.timing.model_copy(update={"warmup": min(plan.timing.warmup, 3)}))
    answer = ctx.call(*in_checkout(stack, GLUE, glue), label="stack glue ops").model_dump(mode="json")
    for line in glue_op_lines(answer, bandwidth_tbs):
        log(ctx, line, kind="measurement")
    return answer


def glue_op_lines(answer: dict[str, Any], bandwidth_tbs: float) -> list[str]:
    """Devlog lines of the GLUE answer: the call floor (where timed), then one per op against its ideal."""
    floor, tokens = answer["call_floor_ms"], answer["tokens"]
    lines = [f"stack glue ops: call floor {floor:.4f} ms (a compiled one-element add, fwd+bwd)"] if floor else []
    return lines + [describe_op(judge_op(op, bandwidth_tbs, [], floor_ms=floor), tokens) for op in answer["ops"]]


def describe_op(row: dict[str, Any], tokens: int) -> str:
    """One judged glue op (judge_op): ms/step by its timer, x its ideal, its best-known kernel where timed."""
    ideal = f"{row['ratio']:.1f}x ideal" if row["ratio"] is not None else "no ideal (no bytes)"
    best = f", best-known {row['best_known_ms']:.4f} ms/step" if row["best_known_ms"] is not None else ""
    return (f"stack glue op {row['op']} ({'compiled' if row['compiled'] else 'eager'}) at {tokens} tokens: "
            f"{row['measured_ms']:.4f} ms/step ({row['timer']} timer), {ideal}{best}")


def compare_trees(rows: list[Cell], tokens: int, *, names: list[str] | None = None) -> dict[str, Any]:
    """Cited wall and glue of the trees at ``tokens`` (``names``: those measured, default all), and what the
    comparison of the stack's code under per-layer compile says."""
    names = names or [name for name, _where, _tree in TREES]
    cited = {name: (c.cited if (c := measured(rows, name, tokens)) else None) for name in names}
    out: dict[str, Any] = {"tokens": tokens, **cited, "reading": "not measured (a cell FAILED: see the worker log)"}
    if None in cited.values():
        return out
    if "per_layer_stack" not in cited:
        return {**out, "reading": "per-layer compile of the stack's code not measured (the run's --per-layer-stack "
                                  "no): the rewrites' share is not told apart from the regions'"}
    main, code, regions = cited["per_layer_main"], cited["per_layer_stack"], cited["regions_stack"]
    out["reading"] = (f"the rewrites move per-layer compile's glue {_change(main, code, 'glue_ms')} and its wall "
                      f"{_change(main, code, 'wall_ms')} (main -> stack code); regions vs per-layer compile of the "
                      f"same code: glue {_change(code, regions, 'glue_ms')}, wall {_change(code, regions, 'wall_ms')}")
    return out


def _change(before: dict[str, float], after: dict[str, float], key: str) -> str:
    return f"{(after[key] - before[key]) / before[key] * 100:+.1f}%"


def judge_op(op: dict[str, Any], bandwidth_tbs: float, blockers: list[str], *,
             floor_ms: float | None) -> dict[str, Any]:
    """One glue op as the stack runs it against its ideal time, and what keeps it from there.

    On CUDA the op's time is the device time of its kernels (timed alone, an op waits on its
    own launches, which a full step hides); on a host timer it is the timed call.
    """
    calls = op["calls_per_step"]
    samples = op["fwdbwd_ms"] or op["fwd_ms"]
    device_ms = op.get("device_ms")
    per_call = device_ms if device_ms is not None else statistics.median(samples)
    nbytes = op["fwd_bytes"] + (op["bwd_bytes"] if op["fwdbwd_ms"] else 0)
    measured, ideal = per_call * calls, ideal_ms(nbytes, bandwidth_tbs) * calls
    glue = op["device_glue_ms"] * calls if op.get("device_glue_ms") is not None else None
    row = {"op": op["op"], "region": op["region"], "compiled": op["compiled"], "measured_ms": measured, "glue_ms": glue,
           "timer": "device" if device_ms is not None else "call", "gemm_gflop": op.get("gemm_flops", 0) / 1e9,
           **best_known_cells(op, calls=calls, measured_ms=measured, device_time=device_ms is not None)}
    if not nbytes:
        return {**row, "ideal_ms": 0.0, "ratio": None, "eager_traffic_ratio": None,
                "blocker": "no ideal: the op moves no tensor bytes across its boundary"}
    # NOTE: the bar counts glue kernels only, so an op holding GEMMs is judged by its glue where the profiler split it
    ratio = (glue if glue is not None else measured) / ideal
    eager_bytes = sum(op["eager_bytes"].values()) if op["fwdbwd_ms"] else op["eager_bytes"]["fwd"]
    traffic = eager_bytes / nbytes
    notes = [b for b in blockers if op["region"] in b]
    return {**row, "ideal_ms": ideal, "ratio": ratio, "eager_traffic_ratio": traffic,
            "blocker": blocker_text(compiled=op["compiled"], ratio=ratio, traffic=traffic, notes=notes,
                                    per_call_ms=per_call, floor_ms=None if device_ms is not None else floor_ms,
                                    gemm_gflop=row["gemm_gflop"], glue_ms=glue)}


def best_known_cells(op: dict[str, Any], *, calls: int, measured_ms: float, device_time: bool) -> dict[str, Any]:
    """The op's best-known kernel per step, by the op's own timer, and what the findings make of it."""
    per_call = per_call_ms(op.get("best_known"), device_time=device_time)
    best_ms = per_call * calls if per_call is not None else None
    cells = {"best_known_ms": best_ms, "best_known": describe(op.get("best_known")), "best_known_beats": None}
    if best_ms is not None and best_ms < measured_ms:
        cells["best_known_beats"] = (
            f"the best-known kernel takes {best_ms:.4f} ms/step against the stack's {measured_ms:.4f}: a candidate "
            "the workflow can take (the region's function calls it; the target then depends on its package), "
            "not taken in this stack: no candidate calling it was submitted")
    return cells


def blocker_text(*, compiled: bool, ratio: float, traffic: float, notes: list[str], per_call_ms: float,
                 floor_ms: float | None, gemm_gflop: float = 0.0, glue_ms: float | None = None) -> str:
    """What the numbers say keeps an op from its ideal ("" when it is within REACHED_RATIO).

    The engine cannot see inside a kernel, so each reason names its evidence and where to look.
    ``floor_ms`` applies to host-timed calls only (a device time has no launch cost in it).
    ``glue_ms``: the op's glue kernels per step, where a device profile split them from its GEMMs.
    """
    if ratio <= REACHED_RATIO:
        return ""
    if gemm_gflop and glue_ms is not None:
        split = (f"its glue kernels alone (GEMM and attention kernels left out) take {glue_ms:.4f} ms/step, "
                 f"{ratio:.1f}x its ideal: ")
        return split + blocker_text(compiled=compiled, ratio=ratio, traffic=traffic, notes=notes,
                                    per_call_ms=per_call_ms, floor_ms=floor_ms)
    if not compiled:
        reason = "not compiled in the stack: it runs eager (no region of the stack takes it)"
    elif gemm_gflop:
        reason = (f"holds GEMMs ({gemm_gflop:.3g} GFLOP a call): its time is matmul as much as bytes, which the "
                  "bytes ideal does not bound; judge its glue from the step's kernel table, or keep the GEMMs "
                  "out of the region")
    elif floor_ms is not None and per_call_ms < FLOOR_FACTOR * floor_ms:
        reason = (f"call overhead: one call takes {per_call_ms:.4f} ms and a compiled one-element add "
                  f"{floor_ms:.4f} ms here, so launch and dispatch set its time, not its bytes: a larger region "
                  "(fused with its neighbours) or CUDA-graph replay is the way down")
    elif traffic > REACHED_RATIO:
        reason = (f"the bytes, likely: its eager ops move {traffic:.1f}x the boundary bytes and compiled it is still "
                  f"{ratio:.1f}x its ideal, as if the kernels kept the intermediate traffic: read the region's "
                  "kernel table for a split kernel or a graph break")
    else:
        reason = (f"the kernel: its eager traffic is already the boundary bytes ({traffic:.1f}x), yet it takes "
                  f"{ratio:.1f}x its ideal: a kernel that does not reach bandwidth at these sizes")
    return "; ".join([reason, *notes])
