"""Per step means per step: the baselines table says why its cited medians do not add up, and how loaded the
host was while timing (blind trial of 2026-12-04: glue 2911.7 ms over a 1999.6 ms wall, no word on it)."""

from __future__ import annotations

import sys

from phases.kit.confirm import run_once
from phases.local_compile_perf.baselines import per_step_notes
from phases.local_compile_perf.per_step import host_load_note, reading
from phases.local_compile_perf.records import Cell


def cell(variant: str, *, wall: float, kernel: float, glue: float) -> Cell:
    return Cell(variant=variant, tree=variant, tokens=1024, status="measured",
                cited={"wall_ms": wall, "kernel_ms": kernel, "glue_ms": glue})


def test_a_row_whose_glue_and_kernel_exceed_the_wall_gets_a_reason_and_one_that_adds_up_gets_none() -> None:
    rows = [cell("upstream", wall=1999.588, kernel=4189.742, glue=2911.704),
            cell("per_layer", wall=100.0, kernel=97.0, glue=40.0),
            Cell(variant="per_layer", tree="per_layer", tokens=2048, status="not_applicable", reason="skipped")]
    (note,) = per_step_notes(rows, cuda=False)
    assert note.startswith("upstream at 1024 tokens: the kernel total is 2.10x the wall: host ops timed")
    glue_over_kernel = per_step_notes([cell("eager", wall=100.0, kernel=95.0, glue=97.0)], cuda=True)
    assert glue_over_kernel == ["eager at 1024 tokens: glue 97.000 ms > kernel total 95.000 ms: "
                                "each column is a median over fresh processes, taken separately"]


def test_the_per_step_reading_on_cuda_names_overlap_and_idle_time() -> None:
    assert "several streams overlap" in reading(kernel=130.0, wall=100.0, cuda=True)["why"]
    assert "device idle" in reading(kernel=50.0, wall=100.0, cuda=True)["why"]
    assert reading(kernel=100.0, wall=100.0, cuda=True, parts=99.0)["holds"]


def test_host_load_is_sampled_while_a_fresh_process_runs_and_a_loaded_host_is_named() -> None:
    outcome = run_once([sys.executable, "-c", "import time; time.sleep(0.8); print('RESULT {}')"], index=0, env=None,
                       poll_gpu=False, timeout_s=30)
    assert outcome.status == "ok" and outcome.host_load is not None and outcome.host_load >= 0
    assert "other processes shared the CPUs" in host_load_note(5.2, 2)
    assert "up to 1.9 on 2 CPUs" in host_load_note(1.9, 2) and "shared" not in host_load_note(1.9, 2)
    assert host_load_note(None, 2) == ""
