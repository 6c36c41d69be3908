"""Rank glue candidates by what a fix can win, and decide when to stop.

score = (measured - ideal) x share_of_layer, with share_of_layer = measured / layer, so a
3x gap on 1% of the layer ranks below a 1.3x gap on 15%. Items whose possible gain
((measured - ideal) / layer) is under the threshold (~1% of the layer) are dropped unless
they fix correctness or remove a host sync; those are kept and say why. The stop rule
holds when nothing remains above the threshold: the remaining gap to ideal, or the next
candidate's gain, is under ~1% of the layer.
"""

from __future__ import annotations

from typing import Iterable

from phases.kit.records import RankItem, Ranked, StopDecision

DEFAULT_THRESHOLD = 0.01
"""Share of the layer under which a candidate is not worth a change (~1%)."""


def score_candidate(candidate: RankItem) -> Ranked:
    """Score one candidate from its table values (no filtering)."""
    if candidate.layer_ms <= 0:
        raise ValueError(f"rank: candidate {candidate.name!r} has layer_ms={candidate.layer_ms}; "
                         "measure the layer first")
    share = candidate.measured_ms / candidate.layer_ms
    gap = candidate.measured_ms - candidate.ideal_ms
    return Ranked(candidate=candidate, share_of_layer=share, score_ms=gap * share,
                  gain_share=gap / candidate.layer_ms, kept_because="")


def rank_candidates(rows: Iterable[RankItem], *, threshold: float = DEFAULT_THRESHOLD) -> list[Ranked]:
    """Score, drop items under ``threshold`` of the layer unless flagged, sort by score.

    Args:
        rows: candidates with measured, ideal and layer times from the tables.
        threshold: minimum gain as a share of the layer.

    Returns:
        Ranked candidates, best first.
    """
    kept = []
    for ranked in map(score_candidate, rows):
        if ranked.gain_share >= threshold:
            kept.append(ranked)
        elif reason := _flag_reason(ranked.candidate):
            kept.append(ranked.model_copy(update={"kept_because": reason}))
    return sorted(kept, key=lambda r: -r.score_ms)


def _flag_reason(candidate: RankItem) -> str:
    reasons = [r for r, on in (("fixes correctness", candidate.fixes_correctness),
                               ("removes a host sync", candidate.removes_host_sync)) if on]
    return " and ".join(reasons)


def evaluate_stop_rule(ranked: list[Ranked], layer_ms: float, threshold: float = DEFAULT_THRESHOLD) -> StopDecision:
    """Stop when the best remaining gain (by score order) is under ``threshold`` of the layer.

    Flagged items (correctness, host sync) never let the rule stop: they must be done.
    """
    must_do = [r for r in ranked if r.kept_because]
    if must_do:
        top = must_do[0]
        return StopDecision(stop=False, threshold=threshold, top=top,
                            reason=f"{top.candidate.name} {top.kept_because}")
    if not ranked:
        return StopDecision(stop=True, threshold=threshold, top=None,
                            reason=f"no candidate gains >= {threshold:.1%} of the {layer_ms:.3f} ms layer")
    top = ranked[0]
    gain_ms = top.candidate.measured_ms - top.candidate.ideal_ms
    stop = gain_ms < threshold * layer_ms
    verdict = "under" if stop else "at or above"
    return StopDecision(stop=stop, threshold=threshold, top=top,
                        reason=f"next candidate {top.candidate.name} can gain {gain_ms:.3f} ms, "
                               f"{verdict} {threshold:.1%} of the {layer_ms:.3f} ms layer")
