"""The stack's bar: glue at least GLUE_BAR_PCT under per-layer compile of main, wall not above it.

Read from the findings' own interleaved cells (``stack_code.per_tokens``). Where the bar is
missed, the shortfall in ms is set against the glue-op table (``stack_code.ops``, timed at one
token count): what each op spends above its ideal and above its best-known kernel, largest
first. The first op is the one that blocks the bar; whether closing it alone to its ideal
would cover the shortfall is said, not assumed (the table's token count may not be the
shortfall's).
"""

from __future__ import annotations

from typing import Any

GLUE_BAR_PCT = 30.0
"""The stack's glue must sit at least this far (%) under per-layer compile of main at every per-layer count."""


def judge_glue_bar(per_tokens: list[dict[str, Any]], ops: list[dict[str, Any]], *,
                   glue_tokens: int) -> dict[str, Any]:
    """{rows: one per token count, met, blockers: ops by their room above ideal, blocked_by: text}."""
    rows = [_row(t) for t in per_tokens]
    met = bool(rows) and all(r["met"] for r in rows)
    blockers = [] if met else sorted((_room(o) for o in ops if o.get("ratio") is not None),
                                     key=lambda b: -b["above_ideal_ms"])
    return {"bar_pct": GLUE_BAR_PCT, "rows": rows, "met": met, "glue_tokens": glue_tokens,
            "blockers": blockers, "blocked_by": "" if met else _blocked_by(rows, blockers, glue_tokens)}


def _row(t: dict[str, Any]) -> dict[str, Any]:
    main, stack = t.get("per_layer_main"), t.get("regions_stack")
    if not main or not stack:
        return {"tokens": t["tokens"], "met": False, "measured": False}
    target = main["glue_ms"] * (1 - GLUE_BAR_PCT / 100)
    glue_pct = (stack["glue_ms"] - main["glue_ms"]) / main["glue_ms"] * 100
    wall_ok = stack["wall_ms"] <= main["wall_ms"]
    return {"tokens": t["tokens"], "measured": True, "main_glue_ms": main["glue_ms"], "stack_glue_ms": stack["glue_ms"],
            "target_glue_ms": target, "glue_pct": glue_pct, "shortfall_ms": max(0.0, stack["glue_ms"] - target),
            "main_wall_ms": main["wall_ms"], "stack_wall_ms": stack["wall_ms"], "wall_ok": wall_ok,
            "met": stack["glue_ms"] <= target and wall_ok}


def _room(op: dict[str, Any]) -> dict[str, Any]:
    """``glue_ms`` (the op's glue kernels, where a device profile split them from its GEMMs) is what
    the bar's glue counts, so it sets the room above the ideal where known."""
    best, glue = op.get("best_known_ms"), op.get("glue_ms")
    return {"op": op["op"], "measured_ms": op["measured_ms"], "glue_ms": glue, "ideal_ms": op["ideal_ms"],
            "ratio": op["ratio"], "above_ideal_ms": max(0.0, (glue if glue is not None else op["measured_ms"])
                                                        - op["ideal_ms"]),
            "best_known_ms": best, "above_best_known_ms": None if best is None else op["measured_ms"] - best,
            "blocker": op.get("blocker") or "reached"}


def _blocked_by(rows: list[dict[str, Any]], blockers: list[dict[str, Any]], glue_tokens: int) -> str:
    short = [r for r in rows if r["measured"] and not r["met"]]
    if not short:
        return "not measured: a cell of the side-by-side comparison FAILED"
    if not blockers:
        return "no glue op with an ideal time was timed: nothing to name"
    top, at_table = blockers[0], next((r for r in short if r["tokens"] == glue_tokens), None)
    text = f"{top['op']} spends {top['above_ideal_ms']:.3f} ms/step above its ideal at {glue_tokens} tokens"
    if at_table is None:
        return text + (f"; the shortfall is at {', '.join(str(r['tokens']) for r in short)} tokens, where the op "
                       "table was not timed")
    if not at_table["wall_ok"] and at_table["shortfall_ms"] == 0:
        return f"wall, not glue: the stack's wall is above per-layer compile's at {glue_tokens} tokens"
    covers = top["above_ideal_ms"] >= at_table["shortfall_ms"]
    return (f"{text}, against a shortfall of {at_table['shortfall_ms']:.3f} ms: closing it to its ideal alone "
            f"{'would cover' if covers else 'would not cover'} the shortfall")
