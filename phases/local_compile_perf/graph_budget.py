"""Step 6, graph budget: every region the candidate's tree enables, over all shapes + no_grad.

Counted in the candidate's checkout (kit graphs: Dynamo reset, fwd+bwd at every token
count, then a no_grad forward each), per region from its function's cache entries. The
candidate is rejected when any region hits the recompile limit or goes over the headroom
target (75% of the limit, 6 of 8), or when its regions do not compile at all.
"""

from __future__ import annotations

from typing import Any

from orchestrator.errors import WorkerFailed
from orchestrator.phase_api import PhaseResult
from phases.local_compile_perf.candidates import current, reject
from phases.local_compile_perf.devlog import log

IN_CHECKOUT = "phases.local_compile_perf.work.checkout:run_in_checkout"
BUDGET = "phases.local_compile_perf.work.candidate_checks:graph_budget_worker"


def candidate_tree_regions(prepared: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys([*prepared["stack_regions"], *prepared["candidate_regions"]]))


def run(ctx: Any) -> PhaseResult:
    plan, cand = ctx.results["plan"], current(ctx)
    prepared = cand["prepared"]
    regions = candidate_tree_regions(prepared)
    request = {"harness": plan["harness"], "regions": regions, "tokens": plan["tokens"], "device": plan["device"]}
    try:
        count = ctx.call_worker(IN_CHECKOUT, {"checkout": prepared["candidate_checkout"], "func": BUDGET,
                                              "request": request}, label="graph budget")
    except WorkerFailed as exc:
        return reject(ctx, f"regions {regions} do not compile over the model's shapes: "
                           f"{exc.message.splitlines()[-1][:300]}")
    per = count["per_function"] or {"(all regions)": count["unique_graphs"]}
    worst = max(per.values())
    numbers = {"per_region": per, "unique_graphs": count["unique_graphs"], "limit": count["recompile_limit"],
               "target": count["target"], "limit_hit": count["limit_hit"], "tokens": plan["tokens"], "no_grad": True}
    ctx.add_record("graph_count", {"candidate": cand["id"], **numbers})
    log(ctx, f"graph budget of {cand['label']!r}: {per} over tokens {plan['tokens']} + no_grad, limit "
             f"{count['recompile_limit']}, target <= {count['target']}", kind="measurement")
    if count["limit_hit"]:
        return reject(ctx, f"recompile limit hit: {count['limit_hit']}", numbers=numbers)
    if worst > count["target"]:
        over = ", ".join(f"{name} {n}" for name, n in per.items() if n > count["target"])
        return reject(ctx, f"graphs per region over the headroom target {count['target']} of "
                           f"{count['recompile_limit']}: {over}", numbers=numbers)
    return PhaseResult(outcome="passed", summary=f"graph budget: worst {worst} <= {count['target']} of "
                                                 f"{count['recompile_limit']}", data={"graphs": numbers})
