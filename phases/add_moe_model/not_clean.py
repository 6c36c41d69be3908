""""Not a clean pass", one row per caveat, each with its cause and the event that records it.

``caveats.caveats`` names what a ``done`` run did not pass ("numerics WARN", "parallelism rows 3 FAIL,
1 UNRUN", ...); this module gives each of them its cause, read from the records and never inferred:
the numerics tier from the verdict, the residual's explanation from the gap-analysis rows (patches that
bring max_diff to 0.00, or a kernel difference verified as the skill says), each torchrun row's recorded
root cause, each build-check error, each waiver's reason. A cause no record shows is "not explained".
The commit message, MODEL_COMPATIBILITY.md and the run's summary all render these rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from phases.add_moe_model.caveats import caveats, gpus
from phases.add_moe_model.cited import Cited
from phases.add_moe_model.records import GapAnalysis, GapRow, Results, TorchrunRow
from phases.add_moe_model.rules import KL_PASS, KL_WARN

NOT_PASSED = ("FAIL", "UNRUN")
RESIDUAL_CODE = "residual_gap_unexplained"
NOT_EXPLAINED = "not explained"
TIERS = {"WARN": f" (the skill's WARN tier: {KL_PASS:.0e} <= KL < {KL_WARN:.0e})",
         "FAIL": f" (the skill's FAIL tier: KL >= {KL_WARN:.0e})"}


@dataclass(frozen=True)
class Caveat:
    """One row of "Not a clean pass"."""

    label: str
    """What did not pass: "numerics WARN", "torchrun FSDP (2 GPUs), FSDP+EP (2 GPUs): FAIL", ..."""
    cause: str
    """Its cause with the seq of every record it restates."""
    brief: str
    """The cause in a few words with its seq, for the one-line summary."""
    detail: str = ""
    """The measurements behind the cause (the gap-analysis rows), where a document may show them elsewhere."""

    def line(self, *, detail_elsewhere: str = "") -> str:
        """The row in full, or with its detail replaced by a pointer to where the document shows it."""
        detail = (detail_elsewhere or self.detail) if self.detail else ""
        return f"{self.label}: {self.cause}" + (f"; {detail}" if detail else "")


@dataclass(frozen=True)
class Residual:
    """The cause of the bf16 gap as the gap-analysis rows show it."""

    verdict: str
    """"explained: ..." where a record shows the cause, else "not explained"."""
    evidence: str
    """The rows measured on the way, each with its seq."""
    brief: str

    def text(self) -> str:
        return self.verdict + (f"; {self.evidence}" if self.evidence else "")


def not_clean_rows(results: Results, cited: Cited) -> list[Caveat]:
    """Every caveat of the run with its cause; empty for a clean pass."""
    rows = [numerics_row(results, cited)] if _numerics_not_pass(results) else []
    rows += torchrun_rows(results, cited) + build_check_rows(results, cited) + waiver_rows(results, cited)
    return rows


def summary_suffix(results: Results, cited: Cited) -> str:
    """"; numerics WARN; parallelism rows 3 FAIL, 1 UNRUN (causes: ...)", or "" for a clean pass: the names
    ``caveats`` gives, then each row's cause in a few words with its seq."""
    names = caveats(results)
    if not names:
        return ""
    causes = "; ".join(f"{row.label}: {row.brief}" for row in not_clean_rows(results, cited))
    return "".join(f"; {name}" for name in names) + f" (causes: {causes}; each in full in MODEL_COMPATIBILITY.md)"


def _numerics_not_pass(results: Results) -> bool:
    return results.numerics is not None and results.numerics.verdict.status != "PASS"


def numerics_row(results: Results, cited: Cited) -> Caveat:
    assert results.numerics is not None
    verdict = results.numerics.verdict
    tier = (f"KL {sci(verdict.kl)}{TIERS.get(verdict.status, '')}, max_diff {sci(verdict.max_diff)} "
            f"({cited.phase('numerics')}, numerics.json bfloat16 row)")
    residual = residual_cause(results.gap_analysis, cited)
    return Caveat(label=f"numerics {verdict.status}", cause=f"{tier}; its cause: {residual.verdict}",
                  brief=residual.brief, detail=residual.evidence)


def residual_cause(gap: GapAnalysis | None, cited: Cited) -> Residual:
    """The residual's cause where a gap-analysis row measured one, else "not explained" with what was measured.

    Explained means what gap analysis itself requires: the latest measurement is max_diff 0.00 (the patches
    applied name the cause), or a row since the last applied patch verified a kernel difference (the stage
    trace's verification; in runs from before the trace, the kernel check's numbers).
    """
    if gap is None or not gap.rows:
        none = f"{NOT_EXPLAINED} (no gap analysis recorded)"
        return Residual(verdict=none, evidence="", brief=none)
    measured = [r for r in gap.rows if r.label != KERNEL_CHECK]
    evidence = (f"gap analysis ({cited.phase('gap_analysis')}; gap_table.md): "
                + ", ".join(_step_text(r, cited) for r in measured))
    if measured and measured[-1].max_diff == 0.0:
        moved, idle = _patch_effects(measured)
        patches = ", ".join(r.label for r in measured if r.patch_id) or "no patch"
        verdict = (f"explained: with {patches} applied max_diff is 0.00"
                   + (f"; the patches that moved it: {', '.join(moved)}" if moved else "")
                   + (f"; no change measured with {', '.join(idle)}" if idle else ""))
        names = ", ".join(m.split(" (")[0] for m in moved) or patches
        return Residual(verdict=verdict, evidence=evidence,
                        brief=f"explained by {names} ({cited.phase('gap_analysis')})")
    kernel = next((r for r in reversed(_since_last_patch(gap.rows)) if _verified_kernel(r)), None)
    if kernel is not None:
        return Residual(verdict=f"explained: {_kernel_text(kernel, cited)}", evidence=evidence,
                        brief=f"a verified kernel difference ({_row_seq(kernel, cited)})")
    return Residual(verdict=NOT_EXPLAINED, evidence=evidence + _unexplained_detail(gap, cited),
                    brief=f"{NOT_EXPLAINED} ({cited.phase('gap_analysis')})")


def _patch_effects(rows: list[GapRow]) -> tuple[list[str], list[str]]:
    """The applied patches whose row moved max_diff ("+fp32 router gate (3.91e-03 -> 0.00)"), and those whose row
    measured the same max_diff as the row before it (cumulative patches: only the first kind is shown to act)."""
    moved, idle, before = [], [], None
    for row in rows:
        if row.patch_id and before is not None and row.max_diff is not None:
            if row.max_diff == before:
                idle.append(row.label)
            else:
                moved.append(f"{row.label} ({sci(before)} -> {sci(row.max_diff)})")
        before = row.max_diff if row.max_diff is not None else before
    return moved, idle


KERNEL_CHECK = "+kernel align"
"""The kernel-alignment row of runs from before the stage trace (its max_diff repeats the row before it)."""


def _step_text(row: GapRow, cited: Cited) -> str:
    """"+sorted topk max_diff 3.91e-03 (gap_row, seq 52)"; a stage trace's row adds its first divergence and table."""
    data = row.as_data()
    trace = (f"; first divergence: {data.get('first_divergence') or 'none'}; {data.get('trace_table')}"
             if data.get("trace") else "")
    return f"{row.label} max_diff {sci(row.max_diff)} ({_row_seq(row, cited)}{trace})"


def _since_last_patch(rows: tuple[GapRow, ...]) -> tuple[GapRow, ...]:
    last = max((i for i, r in enumerate(rows) if r.patch_id), default=0)
    return rows[last:]


def _verified_kernel(row: GapRow) -> bool:
    """The skill's kernel verification as the row records it: the stage trace's verdict on a trace row; on a
    kernel-check row, HF's kernel on Titan's weights at 0.00 where Titan's experts on HF's routing differ."""
    if row.as_data().get("trace"):
        return bool(row.kernel_verified)
    return bool(row.kernel_verified and row.hf_kernel_on_titan_weights_max_diff == 0.0
                and row.titan_kernel_on_hf_routing_max_diff)


def _kernel_text(row: GapRow, cited: Cited) -> str:
    data = row.as_data()
    if data.get("trace"):
        return (f"a kernel difference the stage trace verified ({_row_seq(row, cited)}; {data.get('trace_table')}): "
                f"{row.description}")
    same, other = row.hf_kernel_on_titan_weights_max_diff, row.titan_kernel_on_hf_routing_max_diff
    return (f"a kernel difference, verified as the skill says: HF's experts kernel on Titan's weights gives max_diff "
            f"{sci(same)}, Titan's experts on HF's routing {sci(other)} ({KERNEL_CHECK}, {_row_seq(row, cited)}; "
            f"log {row.log})")


def _unexplained_detail(gap: GapAnalysis, cited: Cited) -> str:
    """What was measured about a residual no record explains: the last stage trace or kernel check, a waiver."""
    parts = []
    trace = next((r for r in reversed(gap.rows) if r.as_data().get("trace")), None)
    if trace is not None:
        parts.append(f"the last stage trace ({_row_seq(trace, cited)}) measured: {trace.description}")
    kernel = next((r for r in gap.rows if r.label == KERNEL_CHECK), None)
    if kernel is not None and kernel.titan_kernel_on_hf_routing_max_diff is not None:
        same, other = kernel.hf_kernel_on_titan_weights_max_diff, kernel.titan_kernel_on_hf_routing_max_diff
        parts.append(f"the kernel check ({KERNEL_CHECK}, {_row_seq(kernel, cited)}) measured Titan's experts on "
                     f"HF's routing at max_diff {sci(other)} and HF's kernel on Titan's weights at {sci(same)}; "
                     "no row measured the residual's cause")
    if RESIDUAL_CODE in gap.waived:
        seq = cited.answer(f"waive:gap_analysis:{RESIDUAL_CODE}")
        parts.append(f'a person waived the residual: "{gap.waived[RESIDUAL_CODE]}" (answer, seq {seq})')
    return "".join(f"; {part}" for part in parts)


def _row_seq(row: GapRow, cited: Cited) -> str:
    seq = cited.record("gap_row", row.as_data())
    return f"gap_row, seq {seq}" if seq is not None else "gap_row, no event"


def torchrun_rows(results: Results, cited: Cited) -> list[Caveat]:
    """The rows that did not PASS, rows of one status and cause together."""
    groups: dict[tuple[str, str], list[TorchrunRow]] = {}
    for row in (results.parallelism.rows if results.parallelism else ()):
        if row.status in NOT_PASSED:
            groups.setdefault((row.status, row.root_cause or row.error), []).append(row)
    return [torchrun_caveat(status, cause, rows, cited) for (status, cause), rows in groups.items()]


def torchrun_caveat(status: str, cause: str, rows: list[TorchrunRow], cited: Cited) -> Caveat:
    names = ", ".join(f"{r.config} ({gpus(r.world_size)})" for r in rows)
    logs = [r.log for r in rows if r.log]
    evidence = cited.phase("parallelism") + (f"; logs {', '.join(logs)}" if logs else "")
    accepted = cited.answer("unrun_rows") if status == "UNRUN" else None
    if accepted is not None:
        evidence += f"; a person accepted the unrun rows, answer seq {accepted}"
    text = cause or f"{NOT_EXPLAINED} (the row records no cause)"
    return Caveat(label=f"torchrun {names}: {status}", cause=f"{text} ({evidence})",
                  brief=f"{brief_cause(text)} ({cited.phase('parallelism')})")


def build_check_rows(results: Results, cited: Cited) -> list[Caveat]:
    checks = results.parallelism.build_check if results.parallelism else ()
    return [Caveat(label=f"sharding build check world {r.world_size} (tp={r.tp}, ep={r.ep}): {r.status}",
                   cause=f"{r.error or NOT_EXPLAINED + ' (the check records no error)'} ({cited.phase('parallelism')})",
                   brief=f"{brief_cause(r.error or NOT_EXPLAINED)} ({cited.phase('parallelism')})")
            for r in checks if r.status != "PASS"]


def waiver_rows(results: Results, cited: Cited) -> list[Caveat]:
    rows = []
    for phase, codes in results.waived().items():
        for code, reason in codes.items():
            seq = cited.answer(f"waive:{phase}:{code}")
            where = f"answer, seq {seq}" if seq is not None else "answer, no event"
            rows.append(Caveat(label=f"waived by a person: {phase} {code}", cause=f'"{reason}" ({where})',
                               brief=f"a person's reason ({where})"))
    return rows


def brief_cause(text: str, limit: int = 140) -> str:
    """The cause's first clause: up to its first parenthesis or sentence end, at most ``limit`` characters."""
    cut = min((i for i in (text.find(" ("), text.find(". "), text.find("; ")) if i > 0), default=len(text))
    short = text[:cut].rstrip(".")
    return short if len(short) <= limit else short[:limit - 3].rstrip() + "..."


def sci(value: float | None) -> str:
    """"3.91e-03", "0.00" for an exact zero (the skill's word for no gap), "not measured" for None."""
    if not isinstance(value, (int, float)):
        return "not measured"
    return "0.00" if value == 0 else f"{value:.2e}"
