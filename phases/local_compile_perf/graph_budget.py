"""Step 6, graph budget: every region the candidate's tree enables, over all shapes + no_grad; then TP/EP.

Counted in the candidate's checkout (kit graphs: Dynamo reset, fwd+bwd at every token
count, then a no_grad forward each), per region from its function's cache entries. The
candidate is rejected when any region hits the recompile limit or goes over the headroom
target (75% of the limit, 6 of 8), or when its regions do not compile at all.

Within budget, the candidate is build-checked at world 8 (``tp_ep``: shapes per rank, graphs per
region, a zero-token rank, on a fake process group), a step-8 check run here because it is cheap
and a candidate that breaks there cannot be committed: it is rejected before minutes of timing. The
check runs beside the graph count, in its own process (``work/beside``): both compile and time nothing,
so the phase takes the longer of the two, not their sum; its verdict counts only within budget.
The correctness phase carries the verdict into its record and table.
"""

from __future__ import annotations

from typing import Any, Mapping

from orchestrator.phase_api import PhaseContext, PhaseResult
from phases.kit.graphs import GraphBudgetRequest
from phases.kit.records import GraphCount
from phases.kit.workers import GRAPH_BUDGET
from phases.local_compile_perf.candidates import current, in_checkout, reject
from phases.local_compile_perf.devlog import log
from phases.local_compile_perf.records import ParallelBuildCheck, Plan
from phases.local_compile_perf.resume import call_kept
from phases.local_compile_perf.tp_ep import brief, check_call, check_tp_ep, summary, unrun
from phases.local_compile_perf.work.beside import BesideCall, BesideRequest, BesideResult
from phases.local_compile_perf.workers import BESIDE


def run(ctx: PhaseContext) -> PhaseResult:
    plan, cand = ctx.result("plan", Plan), current(ctx)
    prepared = cand.prepared
    regions = prepared.tree_regions
    request = GraphBudgetRequest(harness=plan.harness, device=plan.device, regions=tuple(regions), tokens=plan.tokens)
    ctx.plan(2)  # the graph count beside the candidate's TP/EP build check, then (where it fails) the stack's
    count_result, checked = count_beside_build_check(ctx, plan, prepared, request)
    if count_result.answer is None:
        return reject(ctx, cand, f"regions {regions} do not compile over the model's shapes: "
                                 f"{last_words(count_result)}")
    count = GraphCount.model_validate(count_result.answer).model_dump(mode="json")
    per = count["per_function"] or {"(all regions)": count["unique_graphs"]}
    worst = max(per.values())
    tokens = list(plan.tokens)
    numbers = {"per_region": per, "unique_graphs": count["unique_graphs"], "limit": count["recompile_limit"],
               "target": count["target"], "limit_hit": count["limit_hit"], "tokens": tokens, "no_grad": True,
               "recompile_reasons": count["recompile_reasons"]}
    ctx.add_record("graph_count", {"candidate": cand.id, **numbers})
    log(ctx, f"graph budget of {cand.label!r}: {per} over tokens {tokens} + no_grad, limit "
             f"{count['recompile_limit']}, target <= {count['target']}", kind="measurement")
    breach = budget_breach(numbers, untouched=cand.untouched_regions)
    if breach:
        return reject(ctx, cand, breach, numbers=numbers)
    tp_ep = check_tp_ep(ctx, plan, cand, checked=checked)
    ctx.add_record("tp_ep_build_check", tp_ep.model_dump(mode="json"))
    log(ctx, f"{summary(tp_ep)} ({cand.label!r})", kind="measurement")
    if tp_ep.blocking:
        return reject(ctx, cand, summary(tp_ep), numbers={**numbers, "tp_ep": brief(tp_ep)})
    return PhaseResult(outcome="passed", summary=f"graph budget: worst {worst} <= {count['target']} of "
                                                 f"{count['recompile_limit']}; TP/EP build check "
                                                 f"{tp_ep.check.status}",
                       data={"graphs": numbers, "tp_ep": brief(tp_ep)})


def count_beside_build_check(ctx: PhaseContext, plan: Plan, prepared: Any,
                             request: GraphBudgetRequest) -> tuple[BesideResult, ParallelBuildCheck]:
    """The graph count and the candidate's TP/EP build check, run at once (work/beside: both compile and time
    nothing): the count's result, and the check (UNRUN with the worker's last words where it gave no answer)."""
    calls = [beside_call("graph budget", *in_checkout(prepared.candidate_checkout, GRAPH_BUDGET, request))]
    tp_call = check_call(plan, prepared.candidate_checkout, prepared.tree_regions)
    if tp_call:
        calls.append(beside_call("TP/EP build check of the candidate", *tp_call))
    answer = call_kept(ctx, BESIDE, BesideRequest(calls=tuple(calls)),
                       label="graph budget beside the TP/EP build check")
    count_result = answer.results[0]
    if not tp_call:
        return count_result, unrun(plan, prepared.tree_regions)
    tp_result = answer.results[1]
    if tp_result.answer is None:
        return count_result, unrun(plan, prepared.tree_regions, f"worker failed: {last_words(tp_result)}")
    return count_result, ParallelBuildCheck.model_validate(tp_result.answer)


def last_words(result: BesideResult) -> str:
    """The last line of a call's log that gave no answer (its status where the log is empty)."""
    return result.error.splitlines()[-1][:300] if result.error.strip() else result.status


def beside_call(label: str, worker: Any, request: Any) -> BesideCall:
    return BesideCall(label=label, func=worker.ref, models=worker.models(),
                      request=worker.request.model_validate(request).model_dump(mode="json"))


def budget_breach(numbers: dict[str, Any], *, untouched: Mapping[str, str]) -> str:
    """Why the graphs break the budget ("" when they do not): the regions over it, each with the guard that
    failed last, and which of them the candidate named without changing them."""
    per, limit, target = numbers["per_region"], numbers["limit"], numbers["target"]
    if numbers["limit_hit"]:
        offenders = [name for name, n in per.items() if n >= limit] or [max(per, key=per.get)]
        head = f"recompile limit hit by {', '.join(offenders)}: {numbers['limit_hit']}"
    else:
        offenders = [name for name, n in per.items() if n > target]
        if not offenders:
            return ""
        head = (f"graphs per region over the headroom target {target} of {limit}: "
                + ", ".join(f"{name} {per[name]}" for name in offenders))
    reasons = numbers.get("recompile_reasons") or {}
    why = [f"{name} recompiled last on: {reasons[name]}" for name in offenders if name in reasons]
    named = [f"{name} is named by the submission and declared in {untouched[name]}, which its changes do not "
             "touch (enabled as declared)" for name in offenders if name in untouched]
    return "; ".join([head, *why, *named])
