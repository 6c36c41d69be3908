"""The findings' bar: glue 30% under per-layer compile of main, and what blocks it where missed.

Inputs are the 2026-11-30 H200 run's interleaved cells and glue-op rows (FINDINGS.md there).
"""

from __future__ import annotations

from types import SimpleNamespace

from orchestrator.context import render_template
from phases.local_compile_perf.glue_bar import judge_glue_bar


def cells(main_glue: float, main_wall: float, stack_glue: float, stack_wall: float) -> dict:
    return {"per_layer_main": {"glue_ms": main_glue, "wall_ms": main_wall},
            "regions_stack": {"glue_ms": stack_glue, "wall_ms": stack_wall}}


PER_TOKENS = [{"tokens": 4096, **cells(5.789, 58.817, 4.336, 57.398)},
              {"tokens": 16384, **cells(22.508, 348.925, 15.963, 342.810)}]


def op(name: str, measured: float, ideal: float, best: float | None = None, blocker: str = "call overhead") -> dict:
    return {"op": name, "measured_ms": measured, "ideal_ms": ideal, "ratio": measured / ideal,
            "best_known_ms": best, "blocker": blocker}


OPS = [op("rms_norm", 1.6579, 0.55089, best=0.9), op("router", 0.6345, 0.00639),
       op("mla_qk", 16.9592, 2.26941, blocker="the bytes, likely"), op("moe_combine", 3.8664, 1.59803),
       {"op": "norm_free", "measured_ms": 0.1, "ideal_ms": 0.0, "ratio": None, "best_known_ms": None}]


def test_a_stack_short_of_the_bar_names_the_op_with_most_room_above_its_ideal() -> None:
    bar = judge_glue_bar(PER_TOKENS, OPS, glue_tokens=16384)
    assert not bar["met"]
    at_4096, at_16384 = bar["rows"]
    assert round(at_4096["glue_pct"], 1) == -25.1 and round(at_16384["glue_pct"], 1) == -29.1
    assert at_4096["wall_ok"] and at_16384["wall_ok"]
    assert abs(at_16384["shortfall_ms"] - (15.963 - 22.508 * 0.7)) < 1e-9
    assert [b["op"] for b in bar["blockers"]] == ["mla_qk", "moe_combine", "rms_norm", "router"]  # no ideal: left out
    assert bar["blockers"][2]["above_best_known_ms"] == 1.6579 - 0.9
    assert bar["blocked_by"].startswith("mla_qk spends 14.690 ms/step above its ideal at 16384 tokens")
    assert bar["blocked_by"].endswith("closing it to its ideal alone would cover the shortfall")


def test_the_bar_is_met_only_with_glue_under_it_and_wall_not_above_at_every_count() -> None:
    met = [{"tokens": 4096, **cells(10.0, 50.0, 6.9, 49.0)}, {"tokens": 16384, **cells(40.0, 300.0, 27.0, 300.0)}]
    bar = judge_glue_bar(met, OPS, glue_tokens=16384)
    assert bar["met"] and bar["blockers"] == [] and bar["blocked_by"] == ""
    slower = [met[0], {"tokens": 16384, **cells(40.0, 300.0, 27.0, 301.0)}]
    bar = judge_glue_bar(slower, OPS, glue_tokens=16384)
    assert not bar["met"] and bar["blocked_by"].startswith("wall, not glue")
    failed = judge_glue_bar([met[0], {"tokens": 16384}], OPS, glue_tokens=16384)
    assert not failed["met"] and failed["rows"][1] == {"tokens": 16384, "met": False, "measured": False}


def test_a_shortfall_away_from_the_op_tables_count_says_the_table_was_not_timed_there() -> None:
    rows = [{"tokens": 4096, **cells(10.0, 50.0, 8.0, 49.0)}, {"tokens": 16384, **cells(40.0, 300.0, 27.0, 299.0)}]
    bar = judge_glue_bar(rows, OPS, glue_tokens=16384)
    assert bar["blocked_by"].endswith("the shortfall is at 4096 tokens, where the op table was not timed")


def test_findings_show_the_bar_and_its_blockers() -> None:
    spec = SimpleNamespace(name="embedded:dsv3", layer_kinds=("dense", "moe"), ac_mode="none", fp32_precision="tf32")
    stack_code = {"commit": "60e5f09394aa", "regions": ["router"], "per_tokens": [], "glue_tokens": 16384,
                  "call_floor_ms": 0.48, "ops": []}
    summary = {"plan": SimpleNamespace(spec=spec, device="cuda", device_name="NVIDIA H200"), "entries": [],
               "per_tokens": [], "rejected": [], "limits": [], "not_tested": (), "feedback": [], "linear": True,
               "glue_bar_pct": 30.0, "ops_add_up": "The ops add up to 1.000 ms/step.",
               "runs": 3, "bandwidth": {"tbs": 4.26, "kind": "hbm"}, "stack_code": stack_code, "reached_ratio": 1.5,
               "glue_bar": judge_glue_bar(PER_TOKENS, OPS, glue_tokens=16384)}
    text = render_template("local_compile_perf", "findings.md.j2", s=summary)
    assert "glue at least 30% under per-layer compile of main at every per-layer token count" in text
    assert ": not met." in text
    assert "| 4096 | 5.789 / 58.817 | 4.336 / 57.398 | -25.1% | 4.052 | 0.284 | not above |" in text
    assert "What blocks it: mla_qk spends 14.690 ms/step" in text and "The ops add up to 1.000 ms/step." in text
    assert "| rms_norm | 1.6579 | n/a | 1.1070 | 3.0 | +0.7579 | call overhead |" in text
    assert "| router | 0.6345 | n/a | 0.6281 | 99.3 | n/a (none measured) | call overhead |" in text


def test_an_op_holding_gemms_is_judged_by_its_glue_kernels_where_the_profiler_split_them() -> None:
    """The 2026-11-30 table blamed mla_qk for 14.7 ms above its ideal: most of it was its GEMMs (wq_b,
    wkv_b), which the bar's glue does not count. With the device split, the bar names the op whose
    glue kernels have the most room."""
    split = [{**o, "glue_ms": 2.9} if o["op"] == "mla_qk" else o for o in OPS]
    bar = judge_glue_bar(PER_TOKENS, split, glue_tokens=16384)
    assert [b["op"] for b in bar["blockers"]][:2] == ["moe_combine", "rms_norm"]
    mla = next(b for b in bar["blockers"] if b["op"] == "mla_qk")
    assert mla["glue_ms"] == 2.9 and abs(mla["above_ideal_ms"] - (2.9 - 2.26941)) < 1e-9
    assert bar["blocked_by"].startswith("moe_combine spends 2.268 ms/step above its ideal at 16384 tokens")


def test_the_glue_op_table_says_when_its_per_step_times_do_not_add_up_to_the_step() -> None:
    """The CPU trial of 2026-12-04: the table summed to about 1332 ms/step against a 912 ms stack wall, unflagged."""
    from phases.local_compile_perf.findings import ops_add_up

    ops = [{"measured_ms": 640.0}, {"measured_ms": 692.0}]
    code = {"glue_tokens": 1024, "ops": ops, "rows": [{"variant": "regions_stack", "tokens": 512,
                                                       "cited": {"wall_ms": 501.7}}]}
    entry = {"judged": [{"tokens": 1024, "metric": "wall_ms", "candidate": 912.15}]}
    text = ops_add_up(code, [entry], cuda=False)
    assert text.startswith("The ops add up to 1332.000 ms/step against a stack wall of 912.150 ms at 1024 tokens "
                           "(the last stack entry's confirmation): they do not add up (1.46x the wall)")
    assert "host timer" in text
    code["rows"].append({"variant": "regions_stack", "tokens": 1024, "cited": {"wall_ms": 1400.0}})
    assert ops_add_up(code, [entry], cuda=True).endswith("at 1024 tokens (the findings' cells).")
    assert ops_add_up({**code, "rows": []}, [], cuda=True).endswith("no wall of the stack at 1024 tokens to set "
                                                                     "them against.")
    assert ops_add_up(None, [], cuda=True) == ""
