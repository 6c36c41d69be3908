"""Step 4, rank: score = (measured - ideal) x share of the layer, the ~1% cut, the stop rule.

Every number of the ranking comes from one process, the ideal-times phase's glue worker: each
region's ops timed alone, and the whole eager step timed and profiled beside them, whose wall is
the layer time and whose glue, less the ops timed alone, is the row of glue outside every region.
A harness without regions has no such worker; its layer and glue are the baselines' eager cell.
Scores come from the kit's rank (items under the threshold are dropped unless flagged), and the
stop rule is evaluated on the top remaining candidate.
"""

from __future__ import annotations

from typing import Sequence


from orchestrator.phase_api import PhaseContext, PhaseResult
from phases.local_compile_perf.devlog import log
from phases.local_compile_perf.confirmed import measured
from phases.local_compile_perf.records import Baselines, Plan
from phases.local_compile_perf.results import GlueRow, IdealTimes

UNREGIONED = "(glue outside every region)"


def glue_on_wall(glue: float, kernel: float, wall: float) -> float:
    """Profiler glue per step, scaled to the wall where the profiled step ran longer than the timed ones."""
    return glue * min(1.0, wall / kernel) if kernel else glue


def eager_step(ctx: PhaseContext, ideal: IdealTimes) -> tuple[float, float, str]:
    """(layer wall, eager glue on that wall, where both were measured) at the glue ops' token count."""
    if ideal.eager_step:
        step = ideal.eager_step
        return step["wall_ms"], glue_on_wall(step["glue_ms"], step["kernel_ms"], step["wall_ms"]), \
            "the ideal-times worker, beside the ops timed alone"
    row = measured(ctx.result("baselines", Baselines).rows, "eager", ideal.tokens)
    if row is None:
        raise ValueError(f"rank: no measured eager cell at {ideal.tokens} tokens to take the layer time from")
    c = row.cited
    return c["wall_ms"], glue_on_wall(c["glue_ms"], c["kernel_ms"], c["wall_ms"]), "the baselines' eager cell"


def unregioned_row(glue: float, region_rows: Sequence[GlueRow]) -> float:
    """The eager glue per step no declared region takes: the step's glue minus the regions' ops timed alone."""
    return glue - sum(r.measured_ms for r in region_rows)


def stop_caveat(tokens: int, outside: float, glue: float, *, cuda: bool, source: str) -> str:
    timer = "" if cuda else "; host timer: profiler times are host ops, indicative"
    return (f"ranks at {tokens} tokens only: the declared regions' ops, each timed alone in eager, and "
            f"{what_outside(outside, glue, cuda=cuda)}; the layer time and the step's glue are from {source}{timer}")


def what_outside(outside: float, glue: float, *, cuda: bool) -> str:
    """What the ranking saw of the glue outside every region, and why it saw none where it saw none."""
    if outside > 0:
        return (f"the glue outside every region ({outside:.3f} ms of {glue:.3f} ms eager glue per step) ranks as one "
                "row with no ideal (its bytes are not counted)")
    alone = glue - outside
    if outside == 0:
        return f"the regions' ops timed alone account for all {glue:.3f} ms of eager glue, so none outside is seen"
    why = ("each waits on its own launches, which a step hides" if cuda else
           "samples disturbed on a shared host, or per-call overhead a step amortizes")
    return (f"the regions' ops timed alone add up to {alone:.3f} ms, more than the step's {glue:.3f} ms of eager "
            f"glue, so none outside is seen: ops timed alone cost more than in the step ({why})")


def run(ctx: PhaseContext) -> PhaseResult:
    from phases.kit.rank import evaluate_stop_rule, rank_candidates
    from phases.kit.records import RankItem

    ideal = ctx.result("ideal_times", IdealTimes)
    threshold = ctx.result("plan", Plan).stop_threshold
    layer, glue, source = eager_step(ctx, ideal)
    rows = [RankItem(name=r.op, measured_ms=r.measured_ms, ideal_ms=r.ideal_ms, layer_ms=layer) for r in ideal.rows]
    outside = unregioned_row(glue, ideal.rows)
    if outside > 0:
        rows.append(RankItem(name=UNREGIONED, measured_ms=outside, ideal_ms=0.0, layer_ms=layer))
    ranked = rank_candidates(rows, threshold=threshold)
    dropped = sorted({r.name for r in rows} - {k.candidate.name for k in ranked})
    stop = evaluate_stop_rule(ranked, layer, threshold=threshold)
    items = [{"op": k.candidate.name, "measured_ms": k.candidate.measured_ms, "ideal_ms": k.candidate.ideal_ms,
              "gap_ms": k.candidate.measured_ms - k.candidate.ideal_ms, "share_pct": 100 * k.share_of_layer,
              "score_ms": k.score_ms, "gain_pct": 100 * k.gain_share, "kept_because": k.kept_because} for k in ranked]
    for k in items:
        if k["score_ms"] != k["score_ms"]:  # NaN would poison the ranking
            raise ValueError(f"rank: NaN score for {k['op']}")
    caveat = stop_caveat(ideal.tokens, outside, glue, cuda=ctx.result("plan", Plan).cuda, source=source)
    noisy = [r.op for r in ideal.rows if r.noise]
    if noisy:
        caveat += f"; disturbed samples (ideal_times.md says how): {', '.join(noisy)}: their scores may be noise"
    reason = f"{stop.reason} (caveat: {caveat})" if stop.stop else stop.reason
    data = {"layer_ms": layer, "tokens": ideal.tokens, "ranked": items, "dropped": dropped,
            "unregioned_ms": outside, "eager_glue_ms": glue,
            "stop": {"stop": stop.stop, "reason": reason, "threshold": stop.threshold, "caveat": caveat}}
    ctx.write_artifact("ranked.md", ctx.render("ranked.md.j2", rank=data))
    log(ctx, f"ranked {len(items)} glue op(s) on a {layer:.3f} ms layer at {ideal.tokens} tokens "
             f"(dropped under {threshold:.0%}: {', '.join(dropped) or 'none'}); stop rule: {stop.reason}",
        kind="decision")
    top = f", top {items[0]['op']} ({items[0]['score_ms']:.3f} ms)" if items else ""
    return PhaseResult(outcome="passed", summary=f"rank: {len(items)} candidate(s){top}; stop={stop.stop}", data=data)
