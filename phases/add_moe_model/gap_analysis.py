"""Phase 3c: numerical gap analysis with temporary core patches (skill A.4).

Runs whenever numerics is WARN or FAIL, without asking anyone. Rows are cumulative and in application
order: the baseline (the Phase 3 verdict), then each built-in recipe (fp32 accumulation in combine,
token-order sum, sorted top-k) written against the target's current core files and applied through the
engine's ledger, each re-measured in a fresh process. While max_diff is not 0, the skill's step 4 follows:
the stage trace (``gap_trace``) compares HF and Titan stage by stage on the same input and names the first
divergence; the hypothesis patch it points to (``gap_hypotheses``: the router's gate dtype, the experts'
bf16 casts) is applied and measured the same way, and the trace runs again. The residual is explained when
max_diff reaches 0 or the trace verifies a kernel difference (HF's experts kernel on Titan's weights gives
0.00 in Titan's block); then every patch is reverted with proof and the table is written. Otherwise the
text says "not explained" and the run waits for the agent's own hypothesis patches (``orchestrator
patch``), naming the stage where the divergence begins; a person waives it or aborts where none explains
it. An interrupted attempt is reconciled by reverting its patches and starting over.
"""

from __future__ import annotations

from typing import Any

from orchestrator import ledger
from orchestrator.phase_api import Issue, PhaseContext, PhaseResult
from phases.add_moe_model import gap_trace
from phases.add_moe_model.records import GapRow, Numerics, Synthetic
from phases.add_moe_model.work.numerics import CompareRequest
from phases.add_moe_model.workers import NUMERICS, TRACE
from phases.add_moe_model.workspace import EXP

VERDICT_DTYPE = "bfloat16"


def run(ctx: PhaseContext) -> PhaseResult:
    rows = current_rows(ctx)
    if not rows:
        rows.append(record_baseline(ctx))
    ctx.plan(planned_calls(rows))
    for recipe_builder, label in recipe_sequence():
        if closed(rows):
            break
        if label not in labels(rows):
            rows.append(apply_recipe(ctx, recipe_builder, label))
    trace = follow_the_trace(ctx, rows)
    if not explained(rows):
        return wait_for_agent(ctx, rows, trace)
    proof = ledger.revert_all(ctx)
    table = ctx.render("gap_table.md.j2", rows=rows, proof=proof, base=ctx.base["commit"])
    ctx.write_artifact("gap_table.md", table)
    how = explanation(rows)
    return PhaseResult(outcome="passed", summary=f"gap analysis: {len(rows)} rows, {how}; all patches reverted",
                       data={"rows": rows, "reverted": proof, "explanation": how})


def explanation(rows: list[dict[str, Any]]) -> str:
    """How the residual ended, from the rows: the closing row (and what it tested), or the verified kernel trace."""
    final = rows[-1]
    if closed(rows):
        return f"max_diff 0.00 from row '{final['label']}': {final['description']}"
    trace = next(r for r in reversed(rows) if r.get("kernel_verified") and r.get("trace"))
    return f"final max_diff {fmt(final['max_diff'])}, {gap_trace.kernel_text(trace['trace'])}"


def follow_the_trace(ctx: PhaseContext, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Skill step 4: trace, apply the hypothesis the first divergence points to, trace again; stop when max_diff is
    0 or no hypothesis fits (each is tried once). Returns the last trace standing (None when the gap closed)."""
    trace = standing_trace(rows)
    while not closed(rows):
        if trace is None:
            rows.append(trace_row(ctx))
            trace = rows[-1]["trace"]
        hypothesis = gap_trace.pick_hypothesis(trace, tried=labels(rows))
        if hypothesis is None:
            break
        builder, label = hypothesis
        rows.append(apply_recipe(ctx, builder, label, why=gap_trace.ask_text(trace)))
        if rows[-1]["patch_id"] is not None:
            trace = None
    return trace


def standing_trace(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The latest trace when no patch was applied after it (it still describes the tree), else None."""
    for row in reversed(rows):
        if row.get("trace"):
            return row["trace"]
        if row.get("patch_id"):
            return None
    return None


def reconcile(ctx: PhaseContext) -> PhaseResult:
    """The previous attempt died: revert whatever it left applied, then run again (the note says which it was)."""
    opened = sorted(ctx.state["open_patches"])
    proof = ledger.revert_all(ctx)
    if opened:
        said = (f"reverted the temporary patch(es) it left applied ({', '.join(opened)}; {len(proof)} file(s) back "
                f"at the base commit, patch_reverted seq {ctx.state['last_seq']})")
    else:
        said = "no temporary patch was open (nothing to revert)"
    ctx.note(f"gap analysis interrupted: {said}; started over", kind="decision")
    return run(ctx)


def planned_calls(rows: list[dict[str, Any]]) -> int:
    """At most one measurement per built-in recipe not measured yet, and the kernel check: fewer when a recipe does
    not apply or closes the gap."""
    labels = {r["label"] for r in rows}
    return sum(label not in labels for _, label in recipe_sequence()) + ("+kernel align" not in labels)


def current_rows(ctx: PhaseContext) -> list[dict[str, Any]]:
    """The rows this attempt builds on (an interrupted attempt's rows stay in the trail, unused)."""
    attempt = rows_attempt(ctx)
    return [r.as_data() for r in ctx.records(GapRow) if r.attempt == attempt]


def rows_attempt(ctx: PhaseContext) -> int:
    """The attempt whose rows stand: a re-run after a wait for the agent continues the rows whose patches are
    still applied (the agent's own patch row among them, recorded under that attempt); after an interruption
    ``reconcile`` has reverted them all and this attempt starts over."""
    rows = ctx.records(GapRow)
    if any(r.attempt == ctx.attempt for r in rows) or not ctx.state["open_patches"]:
        return ctx.attempt
    applied = [r.attempt for r in rows if r.patch_id in ctx.state["open_patches"]]
    return max(applied, default=ctx.attempt)


def recipe_sequence() -> list[tuple[Any, str]]:
    from phases.add_moe_model import gap_recipes

    return [(gap_recipes.build_fp32_combine_patch, "+fp32 combine accumulation"),
            (gap_recipes.build_token_order_sum_patch, "+token-order reshape+sum"),
            (gap_recipes.build_sorted_topk_patch, "+sorted topk")]


def labels(rows: list[dict[str, Any]]) -> set[str]:
    return {r["label"] for r in rows}


def closed(rows: list[dict[str, Any]]) -> bool:
    """The latest measurement (a patch's, or a trace's of the block) is max_diff 0."""
    return rows[-1]["max_diff"] == 0.0


def explained(rows: list[dict[str, Any]]) -> bool:
    """max_diff 0, or a trace since the last applied patch verified a kernel difference."""
    since = rows[max((i for i, r in enumerate(rows) if r.get("patch_id")), default=0):]
    return closed(rows) or any(r.get("kernel_verified") and r.get("trace") for r in since)


def record_baseline(ctx: PhaseContext) -> dict[str, Any]:
    verdict = ctx.result("numerics", Numerics).verdict
    log = next((n for n in sorted(ctx.state["artifacts"]) if "-numerics-" in n), "")
    return add_row(ctx, GapRow(label="baseline", patch_id=None, attempt=rows_attempt(ctx), max_diff=verdict.max_diff,
                               kl=verdict.kl, description=f"Phase 3 verdict ({verdict.status})", log=log))


def add_row(ctx: PhaseContext, row: GapRow) -> dict[str, Any]:
    """Record ``row`` in the trail; return it as the table's dict."""
    data = row.as_data()
    ctx.add_record("gap_row", data)
    return data


def apply_recipe(ctx: PhaseContext, builder: Any, label: str, *, why: str = "") -> dict[str, Any]:
    """Build a recipe against the current files, apply it through the ledger and measure it (``why``: the trace's
    finding a hypothesis patch tests, said in its row)."""
    recipe = builder(ctx.target)
    reason = f" (tests: {why})" if why else ""
    if recipe.status != "applicable":
        return add_row(ctx, GapRow(label=label, patch_id=None, attempt=rows_attempt(ctx), max_diff=current_max(ctx),
                                   kl=None, description=f"not applicable: {recipe.reason}{reason}", log=""))
    applied = ledger.apply_in_context(ctx, diff=recipe.diff, label=label, scope=(EXP,))
    return ledger_row(ctx, label=label, patch_id=applied["patch_id"], description=recipe.description + reason)


def ledger_row(ctx: PhaseContext, *, label: str, patch_id: str, description: str) -> dict[str, Any]:
    measured = measure_patch(ctx, label)
    return add_row(ctx, GapRow(label=label, patch_id=patch_id, **{**measured, "description": description}))


def take_patch(ctx: PhaseContext, args: Any, tool_call_id: str | None) -> None:
    """The ``patch`` row's check: the ledger applies the agent's patch; its row is measured and built as a recipe's."""
    applied = ledger.accept_patch(ctx, args, tool_call_id)
    ctx.plan(1)
    ledger_row(ctx, label=args.label, patch_id=applied["patch_id"], description="agent patch")


def measure_patch(ctx: PhaseContext, label: str) -> dict[str, Any]:
    """The ledger's measurement: bf16 numerics of the patched tree in a fresh process."""
    answer = ctx.call(NUMERICS, numerics_request(ctx, dtypes=[VERDICT_DTYPE]), label=f"gap {label}").model_dump()
    result = answer["results"][0]
    return {"max_diff": result["max_diff"], "kl": result["kl"], "status": result["status"],
            "log": ctx.last_worker_log, "attempt": rows_attempt(ctx), "description": "agent patch"}


def numerics_request(ctx: PhaseContext, **fields: Any) -> dict[str, Any]:
    """A ``CompareRequest`` for the run's synthetic entry (``dtypes`` for numerics, ``dtype`` for the kernel check)."""
    entry = ctx.result("synthetic_config", Synthetic).entry
    return CompareRequest(model_type=entry["model_type"], config_kwargs=entry, device=ctx.options.get("device", "auto"),
                          seed=42, **fields).model_dump()


def trace_row(ctx: PhaseContext) -> dict[str, Any]:
    """Run the stage trace on the tree as patched now; its row holds the block's max_diff as the trace measured it."""
    before = current_max(ctx)
    trace = ctx.call(TRACE, numerics_request(ctx, dtype=VERDICT_DTYPE), label="stage trace").model_dump()
    log = ctx.last_worker_log
    _, fields = gap_trace.record_trace(ctx, trace, log=log)
    if fields["max_diff"] is not None and before is not None and fields["max_diff"] != before:
        fields["description"] += (f" (the row before measured max_diff {fmt(before)} on the same tree: the two runs "
                                  "disagree)")
    return add_row(ctx, GapRow(label="trace", patch_id=None, attempt=rows_attempt(ctx), kl=None, log=log, **fields))


def current_max(ctx: PhaseContext) -> float | None:
    rows = current_rows(ctx)
    return rows[-1]["max_diff"] if rows else None


RESIDUAL = "residual_gap_unexplained"
# The agent's fix is a hypothesis to measure, not a change to keep: the contract (fixability_numerics.LEDGER_PATCH)
# records it so, and no experiment-folder edit is promised.
RESIDUAL_FIX = ("a temporary hypothesis patch through the patch ledger (core files allowed; measured, then reverted "
                "before the phase passes; never committed): not an edit of the experiment folder")


def wait_for_agent(ctx: PhaseContext, rows: list[dict[str, Any]], trace: dict[str, Any] | None) -> PhaseResult:
    """The residual for the agent, with the trace's first divergence; when a person has waived it, the phase's
    patches are reverted first."""
    data: dict[str, Any] = {"rows": rows}
    attempt = rows_attempt(ctx)  # before a revert empties the ledger
    reverted = ledger.revert_if_waived(ctx, RESIDUAL)
    if reverted is not None:
        rows.append(waived_row(ctx, rows, trace, attempt=attempt))
        data.update(reverted=reverted, explanation=rows[-1]["description"])
        ctx.write_artifact("gap_table.md", ctx.render("gap_table.md.j2", rows=rows, proof=reverted,
                                                      base=ctx.base["commit"]))
    table = next((r["trace_table"] for r in reversed(rows) if r.get("trace_table")), None)
    issue = Issue(code=RESIDUAL,
                  message=f"max_diff {fmt(rows[-1]['max_diff'])} remains after the built-in recipes and the trace's "
                          f"hypotheses, not explained: {gap_trace.ask_text(trace)}"
                          + (f" (stage table: {table})" if table else "") + ". Write a hypothesis patch for that "
                          "stage and submit it (tool submit, kind patch {diff, label}; CLI "
                          f"`orchestrator patch {ctx.run_id} --file PATCH --label TEXT`): it is measured in a fresh "
                          "process and the trace runs again. If no patch explains it, say what you tried in a note: "
                          "a person decides with the trace as evidence (waive residual_gap_unexplained, or abort)",
                  fix_location=RESIDUAL_FIX)
    return PhaseResult(outcome="needs_agent", summary=f"gap analysis: residual max_diff {fmt(rows[-1]['max_diff'])} "
                       f"not explained; {gap_trace.ask_text(trace)}; rows measured: {rows_brief(rows)}", data=data,
                       issues=(issue,))


def rows_brief(rows: list[dict[str, Any]]) -> str:
    """"baseline 3.91e-03, +fp32 router gate 3.91e-03 (KL 1.2e-06), trace 3.91e-03": each row's own numbers, so an
    agent that submitted a patch reads what it measured in the reply."""
    return ", ".join(f"{r['label']} {fmt(r['max_diff'])}" + (f" (KL {r['kl']:.1e})" if r.get("kl") is not None else "")
                     for r in rows)


def waived_row(ctx: PhaseContext, rows: list[dict[str, Any]], trace: dict[str, Any] | None, *,
               attempt: int) -> dict[str, Any]:
    """The table's last word on a residual a person waived: not explained, what the trace measured, their reason."""
    from orchestrator.waivers import waived_codes

    reason = waived_codes(ctx.state, ctx.phase)[RESIDUAL]
    return add_row(ctx, GapRow(label="not explained", patch_id=None, attempt=attempt,
                               max_diff=rows[-1]["max_diff"], kl=None, log="",
                               description=f"residual not explained: {gap_trace.ask_text(trace)}; a person waived "
                                           f"{RESIDUAL} ({reason!r}) and every temporary patch is reverted"))


def fmt(value: Any) -> str:
    return f"{value:.2e}" if isinstance(value, (int, float)) else str(value)
