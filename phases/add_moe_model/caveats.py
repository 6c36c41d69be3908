"""What a finished add-moe-model run did not pass, said the same way wherever its verdict is shown.

A run ends ``done`` once every phase passed its gates, and that includes a numerics WARN (after its gap
analysis), torchrun rows that FAIL with a root cause outside the model (torch 2.13's ``fully_shard`` at
world size > 1), rows a person accepted as unrun, a layout the target declares unsupported and waived
findings. ``caveats`` names them in one line's words and ``not_clean`` gives each its recorded cause; the
commit phase's summary (the run's final summary, which ``status`` and the agent tools show), the commit
message and MODEL_COMPATIBILITY.md all use them, so none of them reads as a clean pass.
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


def torchrun_rows(results: Results) -> list[TorchrunRow]:
    return list(results.parallelism.rows) if results.parallelism else []


def gpus(world_size: int) -> str:
    return f"{world_size} GPU" + ("s" if world_size > 1 else "")
