"""What a reader of FINDINGS needs beside the findings phase's numbers: where cited medians do not add up,
and how loaded the host was while each section was timed (sections timed minutes apart on a shared host
can differ by 10x: the blind trial of 2026-12-05 saw walls of 27 ms and 417 ms for the same code)."""

from __future__ import annotations

import os
from typing import Any

from phases.local_compile_perf import per_step

HEADLINE = ("upstream_main", "per_layer_main", "regions_stack", "per_layer_stack")


def headline_per_step(stack_code: dict[str, Any] | None, *, cuda: bool) -> list[str]:
    """Per headline cell whose cited glue, kernel and wall medians do not add up: why."""
    return [f"{name} at {row['tokens']} tokens: {why}" for row in (stack_code or {}).get("per_tokens", [])
            for name in HEADLINE if row.get(name) and (why := per_step.cited_why(row[name], cuda=cuda))]


def section_loads(stack_code: dict[str, Any] | None) -> dict[str, str]:
    """Per section of the findings (side by side, under AC, cold compile): its host-load line, where sampled."""
    if not stack_code:
        return {}
    cold = (stack_code.get("cold_compile") or {}).get("rows", ())
    loads = {"side by side": per_step.highest_load(r.get("host_load") for r in stack_code.get("rows", ())),
             "under AC": (stack_code.get("under_ac") or {}).get("host_load"),
             "cold compile": per_step.highest_load(r.get("host_load") for r in cold)}
    return {name: note for name, load in loads.items() if (note := per_step.host_load_note(load, os.cpu_count()))}
