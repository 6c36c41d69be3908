"""What a finished add-moe-model run did not pass, said the same way wherever its verdict is shown.

A run ends ``done`` once every phase passed its gates, and that includes a numerics WARN (after its gap
analysis), torchrun rows that FAIL with a root cause outside the model (torch 2.13's ``fully_shard`` at
world size > 1), rows a person accepted as unrun, a layout the target declares unsupported and waived
findings. ``caveats`` names them in one line's words; ``caveat_lines`` adds each row's cause. The commit
phase's summary (the run's final summary, which ``status`` and the agent tools show), the commit message
and MODEL_COMPATIBILITY.md all use them, so none of them reads as a clean pass.
"""

from __future__ import annotations

from phases.add_moe_model.records import Results, TorchrunRow

NOT_PASSED = ("FAIL", "UNRUN")


def caveats(results: Results) -> list[str]:
    """["numerics WARN", "parallelism rows 3 FAIL, 1 UNRUN", ...]; empty for a clean pass."""
    parts = []
    status = results.numerics.verdict.status if results.numerics else None
    if status and status != "PASS":
        parts.append(f"numerics {status}")
    rows = torchrun_rows(results)
    counts = ", ".join(f"{n} {s}" for s in NOT_PASSED if (n := sum(r.status == s for r in rows)))
    if counts:
        parts.append(f"parallelism rows {counts}")
    checks = results.parallelism.build_check if results.parallelism else ()
    build = [f"world {r.world_size} {r.status}" for r in checks if r.status != "PASS"]
    if build:
        parts.append(f"sharding build check {', '.join(build)}")
    waived = sorted({code for codes in results.waived().values() for code in codes})
    if waived:
        parts.append(f"waived by a person: {', '.join(waived)}")
    return parts


def summary_caveat(results: Results) -> str:
    """"; numerics WARN; parallelism rows 3 FAIL, 1 UNRUN (see the report)", or "" for a clean pass."""
    parts = [f"{p} (see the report)" if p.startswith("parallelism rows") else p for p in caveats(results)]
    return "".join(f"; {part}" for part in parts)


def caveat_lines(results: Results) -> list[str]:
    """One line per caveat, the torchrun rows' as ``row_lines`` give them; a numerics tier that is not PASS says how
    its gap analysis ended."""
    lines = [c for c in caveats(results) if not c.startswith("parallelism rows")]
    return [f"{line}; {gap_line(results)}" if line.startswith("numerics ") and gap_line(results) else line
            for line in lines] + row_lines(results)


def gap_line(results: Results) -> str:
    """"its gap analysis reached max_diff 0.00 with the last of 4 temporary core patches (+fp32 router gate), all
    reverted", else how it ended (a verified kernel difference, or "not explained" where a person waived the
    residual), or "" without a gap analysis."""
    gap = results.gap_analysis
    if gap is None or not gap.rows:
        return ""
    last = gap.rows[-1]
    patches = sum(1 for r in gap.rows if r.patch_id)
    if last.max_diff == 0.0 and last.patch_id:
        return (f"its gap analysis reached max_diff 0.00 with the last of {patches} temporary core patches "
                f"({last.label}), all reverted")
    return f"its gap analysis: {gap.explanation or last.description}"


def row_lines(results: Results) -> list[str]:
    """The cause of every torchrun row that did not PASS, rows of one cause on one line."""
    groups: dict[tuple[str, str], list[str]] = {}
    for row in torchrun_rows(results):
        if row.status in NOT_PASSED:
            cause = row.root_cause or row.error or "no cause recorded"
            groups.setdefault((row.status, cause), []).append(f"{row.config} ({gpus(row.world_size)})")
    return [f"torchrun {', '.join(configs)}: {status}: {cause}" for (status, cause), configs in groups.items()]


def torchrun_rows(results: Results) -> list[TorchrunRow]:
    return list(results.parallelism.rows) if results.parallelism else []


def gpus(world_size: int) -> str:
    return f"{world_size} GPU" + ("s" if world_size > 1 else "")
