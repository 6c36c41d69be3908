"""Step 4, rank: score = (measured - ideal) x share of the layer, the ~1% cut, the stop rule.

The layer time is the eager tree's cited wall time at the token count the glue ops were
measured at (the same process-median the baselines table shows). Scores come from the
kit's rank (items under the threshold are dropped unless flagged), and the stop rule is
evaluated on the top remaining candidate.
"""

from __future__ import annotations


from orchestrator.phase_api import PhaseContext, PhaseResult
from phases.local_compile_perf.devlog import log, renders_devlog
from phases.local_compile_perf.confirmed import measured
from phases.local_compile_perf.records import Baselines, Plan


def layer_ms_at(ctx: PhaseContext, tokens: int) -> float:
    row = measured(ctx.result("baselines", Baselines).rows, "eager", tokens)
    if row is None:
        raise ValueError(f"rank: no measured eager cell at {tokens} tokens to take the layer time from")
    return row.cited["wall_ms"]


@renders_devlog
def run(ctx: PhaseContext) -> PhaseResult:
    from phases.kit.rank import evaluate_stop_rule, rank_candidates
    from phases.kit.records import Candidate

    ideal = ctx.results["ideal_times"]
    threshold = ctx.result("plan", Plan).stop_threshold
    layer = layer_ms_at(ctx, ideal["tokens"])
    rows = [Candidate(name=r["op"], measured_ms=r["measured_ms"], ideal_ms=r["ideal_ms"], layer_ms=layer)
            for r in ideal["rows"]]
    ranked = rank_candidates(rows, threshold=threshold)
    dropped = sorted({r.name for r in rows} - {k.candidate.name for k in ranked})
    stop = evaluate_stop_rule(ranked, layer, threshold=threshold)
    items = [{"op": k.candidate.name, "measured_ms": k.candidate.measured_ms, "ideal_ms": k.candidate.ideal_ms,
              "gap_ms": k.candidate.measured_ms - k.candidate.ideal_ms, "share_pct": 100 * k.share_of_layer,
              "score_ms": k.score_ms, "gain_pct": 100 * k.gain_share, "kept_because": k.kept_because} for k in ranked]
    for k in items:
        if k["score_ms"] != k["score_ms"]:  # NaN would poison the ranking
            raise ValueError(f"rank: NaN score for {k['op']}")
    data = {"layer_ms": layer, "tokens": ideal["tokens"], "ranked": items, "dropped": dropped,
            "stop": {"stop": stop.stop, "reason": stop.reason, "threshold": stop.threshold}}
    ctx.write_artifact("ranked.md", ctx.render("ranked.md.j2", rank=data))
    log(ctx, f"ranked {len(items)} glue op(s) on a {layer:.3f} ms layer at {ideal['tokens']} tokens "
             f"(dropped under {threshold:.0%}: {', '.join(dropped) or 'none'}); stop rule: {stop.reason}",
        kind="decision")
    top = f", top {items[0]['op']} ({items[0]['score_ms']:.3f} ms)" if items else ""
    return PhaseResult(outcome="passed", summary=f"rank: {len(items)} candidate(s){top}; stop={stop.stop}", data=data)
