"""pick_fix's reading of the ranking: what the rank phase recorded, and where the stop rule stands now.

The rank phase measures once, before any stack entry, and records ``ranked`` (ops above the
~1% cut, or kept because they fix correctness or a host sync), ``dropped`` (under the cut)
and its stop decision. pick_fix waits again after every stack entry, so it counts both lists
(a bare "0 ranked" read as "nothing was measured") and, once the stack has entries, applies
the kit's stop rule again (same layer, same threshold) to the ranked ops whose region no
stack entry has enabled. Nothing is re-measured here: the ops the stack took on are named
as taken, and the rank phase's own decision stays in its record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from phases.local_compile_perf.rank import UNREGIONED
from phases.local_compile_perf.results import GlueRow, Rank, RankedOp


@dataclass(frozen=True, kw_only=True, slots=True)
class StopNow:
    """The stop rule as it stands in pick_fix.

    Attributes:
        stop: True when the rule holds, e.g. after the stack took every ranked op.
        reason: the rule's reason, e.g. "next candidate swiglu can gain 7.400 ms, at or above ...".
        open_ops: ranked ops no stack entry's regions cover, best first, e.g. ("swiglu",).
        taken_ops: ranked ops whose region a stack entry enabled, e.g. ("rms_norm#1",).
        entries: stack entries so far (0: the rank phase's own decision).
    """

    stop: bool
    reason: str
    open_ops: tuple[str, ...]
    taken_ops: tuple[str, ...]
    entries: int

    def as_data(self) -> dict[str, Any]:
        return {"stop": self.stop, "reason": self.reason, "open_ops": list(self.open_ops),
                "taken_ops": list(self.taken_ops), "after_stack_entries": self.entries}


def _plural(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def resolve_op_regions(rank: Rank, ideal_rows: Sequence[GlueRow]) -> dict[str, str]:
    """op -> region of every ranked op (from the ideal-times rows; the glue outside every region has none)."""
    regions = {row.op: row.region for row in ideal_rows if row.region}
    return {item.op: regions.get(item.op, "") for item in rank.ranked}


def stop_rule_now(rank: Rank, *, ideal_rows: Sequence[GlueRow], entries: list[dict[str, Any]]) -> StopNow:
    """The rank phase's decision before any stack entry; after one, the kit's rule on the ops still open."""
    from phases.kit.rank import evaluate_stop_rule

    enabled = {region for entry in entries for region in entry.get("regions", ())}
    of = resolve_op_regions(rank, ideal_rows)
    taken = tuple(item.op for item in rank.ranked if of[item.op] in enabled)
    still = [item for item in rank.ranked if item.op not in taken]
    if not entries:
        stop, reason = rank.stop.stop, rank.stop.reason
    else:
        decision = evaluate_stop_rule([_as_ranked(item, rank.layer_ms) for item in still], rank.layer_ms,
                                      threshold=rank.stop.threshold)
        stop, reason = decision.stop, decision.reason
    return StopNow(stop=stop, reason=reason, open_ops=tuple(item.op for item in still), taken_ops=taken,
                   entries=len(entries))


def _as_ranked(item: RankedOp, layer_ms: float) -> Any:
    from phases.kit.records import RankItem, Ranked

    candidate = RankItem(name=item.op, measured_ms=item.measured_ms, ideal_ms=item.ideal_ms, layer_ms=layer_ms)
    return Ranked(candidate=candidate, share_of_layer=item.share_pct / 100, score_ms=item.score_ms,
                  gain_share=item.gain_pct / 100, kept_because=item.kept_because)


def ranking_line(rank: Rank) -> str:
    """What the rank phase recorded: every op it ranked, those above the cut and those dropped under it."""
    kept, dropped = len(rank.ranked), len(rank.dropped)
    flagged = [f"{r.op} {r.kept_because}" for r in rank.ranked if r.kept_because]
    under = f" ({len(flagged)} of them kept under it: {', '.join(flagged)})" if flagged else ""
    return (f"rank recorded {kept + dropped} op(s) at {rank.tokens} tokens: {kept} above the "
            f"{rank.stop.threshold:.1%} cut{under}, {dropped} dropped under it")


def stop_line(now: StopNow) -> str:
    """The stop rule's state in a few words: at rank, or after the stack's entries and on what remains."""
    state = "holds" if now.stop else "open"
    if not now.entries:
        return f"stop rule {state} at rank (before any stack entry)"
    after = f"stop rule {state} after {_plural(now.entries, 'stack entry', 'stack entries')}"
    if not now.open_ops:
        return f"{after}: " + ("the stack's regions take every ranked op" if now.taken_ops else
                               "no op was above the cut at rank")
    line = (f"{after}: {_plural(len(now.open_ops), 'ranked op', 'ranked ops')} outside the stack's regions "
            f"({', '.join(now.open_ops)})")
    if UNREGIONED in now.open_ops:
        line += (f"; {UNREGIONED} is rank's number from before the stack, not re-measured after an entry (the "
                 "findings phase times the stack's glue): it stays open whatever the entries took")
    return line
