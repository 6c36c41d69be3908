"""Fast checks of local-compile-perf's pure parts: options, PR lint, audit rules, rulings, templates."""

from __future__ import annotations

import json
import re
import shutil
import statistics
from pathlib import Path

import pytest

from phases.local_compile_perf import rules
from phases.local_compile_perf.pr_lint import lint_pr_text
from tests.conftest import cli, make_repo
from tests.evidence import unpacked

GOOD_PR = """**TLDR:** real RoPE: one kernel instead of seven; 4096 tokens 10.000 -> 9.000 ms per step (-10.0%).

**Problem**
1. Today the recipe compiles only router.
2. RoPE multiplies complex numbers in eager.
3. Inductor cannot fuse complex ops.
4. Cost at 4096 tokens: 10.000 ms per step.

**Solution**
1. Rotate pairs with cos and sin.
2. Files: rope.py.
3. Regions enabled in trainer_settings.py: rope.
4. Unchanged: the math, other regions.

**Results**
```text
4096 tokens: 10.000 -> 9.000 ms (-10.0%)
```

**Test plan**
- `pytest tests/test_lcp_workflow_e2e.py`
"""


def test_pr_lint_accepts_the_template_shape_and_names_each_broken_rule():
    assert lint_pr_text(GOOD_PR) == []
    bad = GOOD_PR.replace("4. Cost at 4096 tokens: 10.000 ms per step.\n", "") + "\nsee #123 and https://github.com/x/y\n"
    bad += "| a | b |\n|---|---|\n"
    problems = lint_pr_text(bad)
    assert any("3 numbered steps" in p for p in problems)
    assert any("#N reference" in p for p in problems) and any("GitHub URL" in p for p in problems)
    assert any("markdown table" in p for p in problems)
    prose = GOOD_PR.replace("**Test plan**", "This line is prose.\nSo is this one.\nAnd a third one.\n\n**Test plan**")
    assert any("prose paragraph" in p for p in lint_pr_text(prose))
    assert any("missing section **Results**" in p for p in lint_pr_text(GOOD_PR.replace("**Results**", "Results")))


def _event(seq, type_, data, actor="engine"):
    return {"seq": seq, "type": type_, "data": data, "actor": actor}


def _cited(seq, samples, value, name="wall_ms", device="NVIDIA H200", purpose="baseline"):
    labels = {"cited": True, "value": value, "fresh_processes": len(samples), "purpose": purpose,
              "variant": "eager", "tokens": 4096}
    return _event(seq, "measurement_recorded", {"name": name, "samples": samples, "labels": labels,
                                                "provenance": {"device_name": device}})


def test_cited_median_rule_needs_three_samples_and_their_median():
    good = _cited(1, [3.0, 1.0, 2.0], 2.0)
    assert rules.check_cited_medians([good], {}) == []
    assert rules.check_cited_medians([_cited(2, [1.0, 2.0], 1.5)], {})[0][0] == 2
    wrong = rules.check_cited_medians([_cited(3, [1.0, 2.0, 9.0], 4.0)], {})
    assert wrong and "not the median" in wrong[0][1]


def test_launch_mode_rule_wants_replay_rows_on_a_gpu_only():
    wall_gpu = _cited(1, [1.0, 1.0, 1.0], 1.0)
    assert rules.check_both_launch_modes([wall_gpu], {})
    assert rules.check_both_launch_modes([wall_gpu, _cited(2, [1.0, 1.0, 1.0], 1.0, name="replay_ms")], {}) == []
    assert rules.check_both_launch_modes([_cited(3, [1.0, 1.0, 1.0], 1.0, device="cpu: x")], {}) == []


def test_stack_and_scope_rules():
    entry = {"branch": "stack/1-a", "commit": "c1", "parent": "base", "linear": True, "shared_default_edits": []}
    second = {**entry, "branch": "stack/2-b", "commit": "c2", "parent": "c1"}
    events = [_event(i, "record_added", {"kind": "stack_entry", "record": r}) for i, r in enumerate([entry, second])]
    state = {"base": {"commit": "base"}}
    assert rules.check_stack_linear(events, state) == []
    forked = [events[0], _event(1, "record_added", {"kind": "stack_entry", "record": {**second, "parent": "base"}})]
    assert rules.check_stack_linear(forked, state)[0][0] == 1
    shared = [_event(5, "record_added", {"kind": "stack_entry", "record": {**entry, "shared_default_edits": ["x"]}})]
    assert rules.check_no_shared_default(shared, state)[0][0] == 5


def test_traps_and_pr_answer_rules():
    baseline = _cited(2, [1.0, 1.0, 1.0], 1.0)
    traps = _event(1, "worker_finished", {"label": "traps", "status": "ok"})
    assert rules.check_traps_before_baselines([traps, baseline], {}) == []
    assert rules.check_traps_before_baselines([baseline, traps], {})[0][0] == 2
    answer = _event(3, "answer_accepted", {"key": "open_prs", "value": "draft"}, actor="agent")
    assert rules.check_prs_asked_a_human([answer], {})[0][0] == 3


def test_timing_ruling_differs_on_gpu_and_host_timer():
    from phases.local_compile_perf.records import Cell
    from phases.local_compile_perf.screen_confirm import judge, rule_on_timing

    def row(t, samples):
        return Cell(variant="v", tree="eager", tokens=t, status="measured",
                    cited={"wall_ms": statistics.median(samples)}, samples={"wall_ms": samples})

    win = judge(row(1, [10.0, 10.1, 9.9]), row(1, [9.0, 9.1, 8.9]), cuda=True)
    noise = judge(row(2, [10.0, 12.0, 8.0]), row(2, [9.5, 9.6, 9.4]), cuda=True)
    loss = judge(row(3, [10.0, 10.1, 9.9]), row(3, [11.0, 11.1, 10.9]), cuda=True)
    assert [win.verdict, noise.verdict, loss.verdict] == ["win", "neutral", "loss"]
    assert not rule_on_timing([win, noise, loss], cuda=True)["ok"]
    assert not rule_on_timing([loss, loss, win], cuda=True)["ok"]
    on_host = [judge(row(1, [10.0, 10.1, 9.9]), row(1, [9.0, 9.1, 8.9]), cuda=False),
               judge(row(3, [10.0, 10.1, 9.9]), row(3, [11.0, 11.1, 10.9]), cuda=False)]
    assert [j.verdict for j in on_host] == ["indicative", "indicative"] and on_host[0].delta_pct < 0
    host = rule_on_timing(on_host, cuda=False)
    assert host["ok"] and host["wins"] == 0 and "does not gate" in host["reason"] and "indicative" in host["reason"]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_reports_on_a_host_timer_call_nothing_a_win(device):
    """The H200 trail's stack entry re-judged as a host timer would judge it: the findings and PR say indicative.
    The findings' comparisons are the interleaved stack_code rows; the baselines phase's rows are context only."""
    from orchestrator.context import render_template
    from phases.local_compile_perf.records import Cell
    from phases.local_compile_perf.findings import side_by_side
    from phases.local_compile_perf.screen_confirm import cell, judge

    run = json.loads(next((unpacked("2026-11-30-lcp-h200") / "runs").glob("*/run.json")).read_text())
    plan = {**run["results"]["plan"], "device": device}
    entry = run["records"]["stack_entry"][0]
    rows = [Cell.model_validate(r) for r in entry["confirm_rows"]]
    judged = [judge(cell(rows, "stack", t), cell(rows, "candidate", t), cuda=device == "cuda").model_dump()
              for t in plan["sizes"]["tokens"]]
    entry = {**entry, "judged": judged}
    up = {"wall_ms": 40.0, "glue_ms": 6.0}
    code = {"per_tokens": [{"tokens": t, "upstream_main": up, "per_layer_main": up, "per_layer_stack": up,
                            "regions_stack": {"wall_ms": 30.0, "glue_ms": 4.0}} for t in plan["sizes"]["tokens"]]}
    other_session = {"wall_ms": 99.0, "glue_ms": 9.0}
    baselines = [{"tokens": t, "eager": other_session, "upstream": other_session, "per_layer": None}
                 for t in plan["sizes"]["tokens"]]
    summary = {"run_id": "r1", "plan": plan, "entries": [entry], "per_tokens": side_by_side(code),
               "baselines": baselines, "rejected": [], "limits": [],
               "not_tested": ["x"], "feedback": [], "linear": True,
               "glue_bar_pct": 30.0, "runs": 3, "bandwidth": {"tbs": 4.2, "kind": "x"},
               "rewrite_deltas": [], "asked": {entry["branch"]: []}}
    findings = render_template("local_compile_perf", "findings.md.j2", s=summary)
    pr = render_template("local_compile_perf", "pr.md.j2", s=summary, e=entry, findings=findings)
    assert lint_pr_text(pr) == []
    tldr = pr.split("\n", 1)[0]
    compared = [line for line in findings.splitlines() if "->" in line and "tokens" in line and "stack/" not in line]
    assert compared and all("99.000" not in line for line in compared)
    assert "2048 tokens: upstream regions on main -> stack wall 40.000 -> 30.000 ms (-25.0%)" in findings
    assert "2048 tokens: eager 99.000, upstream 99.000, per-layer n/a" in findings
    if device == "cpu":
        for text in (findings, pr):
            assert "indicative" in text and "HBM" not in text and "beats" not in text
            assert all("indicative" in line for line in text.splitlines() if re.search(r"\bwins?\b", line))
        assert "host timer: indicative, not a measured gain" in tldr
    else:
        assert "indicative" not in tldr and "HBM" in pr and "win" in findings


def test_options_need_three_token_counts(tmp_path):
    result = cli("start", "local-compile-perf", "--target", "embedded", "--tokens", "8,16", state_dir=tmp_path / "s")
    assert result.returncode == 2, result.stderr
    assert "at least 3 distinct" in result.stderr
    assert not (tmp_path / "s" / "runs").exists() or not any((tmp_path / "s" / "runs").iterdir())


def test_torchtitan_030_tree_stops_at_plan_with_the_reason(tmp_path):
    import torchtitan

    package = Path(torchtitan.__file__).parent
    tree = tmp_path / "tt"
    shutil.copytree(package, tree / "torchtitan", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    make_repo(tree, {"README": "torchtitan 0.3.0 copy\n"})
    state = tmp_path / "state"
    started = cli("start", "local-compile-perf", "--target", str(tree), "--harness", "x.y:z", "--json", state_dir=state)
    assert started.returncode == 0, started.stderr
    run_id = json.loads(started.stdout)["run_id"]
    advanced = cli("advance", run_id, "--json", state_dir=state)
    assert advanced.returncode == 1, advanced.stderr
    status = json.loads(advanced.stdout)
    assert status["phase"] == "plan" and "no local_compile API" in status["summary"]
    assert status["issues"][0]["code"] == "no_local_compile_api"
    assert cli("audit", run_id, state_dir=state).returncode == 0


def test_templates_render_with_strict_undefined():
    from orchestrator.context import render_template

    text = render_template("local_compile_perf", "ranked.md.j2", rank={
        "tokens": 32, "layer_ms": 10.0, "dropped": ["rms_norm"], "stop": {"stop": False, "reason": "go"},
        "ranked": [{"op": "rope", "measured_ms": 1.0, "ideal_ms": 0.1, "gap_ms": 0.9, "share_pct": 10.0,
                    "score_ms": 0.09, "kept_because": ""}]})
    assert "1. rope" in text and "Dropped (possible gain under the threshold): rms_norm" in text
    with pytest.raises(Exception, match="has no attribute"):
        render_template("local_compile_perf", "ranked.md.j2", rank={"tokens": 1})


def test_findings_keep_a_rejected_candidates_confirmed_timing():
    """A rejection at correctness comes after confirmation, so its deltas are listed; one at the
    graph budget has none. The plan is the H200 run's (bench/results/h200-2026-11-29-s3)."""
    from orchestrator.context import render_template

    run = json.loads((unpacked("h200-2026-11-29-s3") / "run/run.json").read_text())
    confirmed = [{"metric": "wall_ms", "tokens": 2048, "delta_pct": -21.59}, {"metric": "wall_ms", "tokens": 16384,
                                                                              "delta_pct": -14.4}]
    rejected = [{"label": "five rewrites", "branch": "candidate/combined-replay", "phase": "correctness",
                 "reason": "fp32", "numbers": {"confirmed": confirmed}},
                {"label": "norm only", "branch": "candidate/residual-norm", "phase": "graph_budget", "reason": "7 > 6",
                 "numbers": {"target": 6}}]
    summary = {"plan": run["results"]["plan"], "entries": [], "per_tokens": [], "rejected": rejected, "limits": [],
               "not_tested": [], "feedback": [], "linear": True, "runs": 3, "bandwidth": {"tbs": 4.2, "kind": "hbm"},
               "glue_bar_pct": 30.0}
    text = render_template("local_compile_perf", "findings.md.j2", s=summary)
    assert ("- five rewrites (candidate/combined-replay) at correctness: fp32; confirmed first (wall_ms vs the stack, "
            "median of 3): 2048 tokens -21.6%, 16384 tokens -14.4%\n") in text
    assert "- norm only (candidate/residual-norm) at graph_budget: 7 > 6\n" in text
    assert "wall not above it: not met: no candidate was validated, so no stack stands" in text


def test_sizes_default_by_device_and_options_win():
    from phases.local_compile_perf.plan import CPU_SIZES, resolve_sizes

    unset = {"tokens": None, "per_layer_tokens": (), "warmup": None, "iters": None, "profile_steps": None, "runs": 3}
    cuda = resolve_sizes(unset, "cuda")
    assert cuda.tokens == (2048, 4096, 16384) == cuda.per_layer_tokens  # the skill's sizes stay the CUDA defaults
    assert (cuda.timing.warmup, cuda.timing.iters, cuda.timing.profile_steps) == (5, 20, 5)
    cpu = resolve_sizes(unset, "cpu")
    assert cpu == CPU_SIZES and cpu.source == "cpu defaults" and "2 cores" in cpu.why
    assert max(cpu.tokens) < 2048 and set(cpu.per_layer_tokens) < set(cpu.tokens) and cpu.timing.iters < 20
    mixed = resolve_sizes({**unset, "tokens": (8, 16, 32), "iters": 3}, "cpu")
    assert mixed.tokens == (8, 16, 32) == mixed.per_layer_tokens and mixed.timing.iters == 3
    assert mixed.timing.warmup == CPU_SIZES.timing.warmup and mixed.source == "cpu defaults"
    given = resolve_sizes({**unset, "tokens": (8, 16, 32), "per_layer_tokens": (16,), "warmup": 1, "iters": 3,
                           "profile_steps": 1}, "cuda")
    assert given.source == "given" and given.per_layer_tokens == (16,) and given.why == "as given"
    why = "2/6/2 steps: a 30-minute device session; 3 fresh processes still within 2% of their median"
    told = resolve_sizes({**unset, "tokens": (8, 16, 32), "per_layer_tokens": (16,), "warmup": 1, "iters": 3,
                          "profile_steps": 1, "sizes_why": why}, "cuda")
    assert told.why == why, "the reason for sizes below the skill's goes into plan.md and the devlog"


def test_per_layer_tokens_need_explicit_tokens(tmp_path):
    result = cli("start", "local-compile-perf", "--target", "embedded", "--per-layer-tokens", "512",
                 state_dir=tmp_path / "s")
    assert result.returncode == 2 and "--per-layer-tokens needs --tokens" in result.stderr
    assert not (tmp_path / "s" / "runs").exists() or not any((tmp_path / "s" / "runs").iterdir())


def test_eta_from_the_steps_done():
    from orchestrator.progress import Eta

    now = [100.0]
    eta = Eta(4, clock=lambda: now[0])
    assert eta.describe() == "step 1 of 4, ETA after the first step"
    now[0] += 30
    eta.step_done()
    assert eta.describe() == "step 2 of 4, ETA 1m30s"
    now[0] += 3570
    eta.step_done()
    assert eta.describe() == "step 3 of 4, ETA 1h00m"


def test_what_blocks_a_glue_op_names_its_evidence():
    from phases.local_compile_perf.stack_code import blocker_text

    common = {"notes": [], "per_call_ms": 1.0, "floor_ms": 0.1}
    assert blocker_text(compiled=True, ratio=1.2, traffic=9.0, **common) == ""
    assert blocker_text(compiled=False, ratio=9.0, traffic=9.0, **common).startswith("not compiled in the stack")
    assert blocker_text(compiled=True, ratio=9.0, traffic=9.0, **common).startswith("the bytes, likely")
    assert blocker_text(compiled=True, ratio=9.0, traffic=1.1, **common).startswith("the kernel")
    overhead = blocker_text(compiled=True, ratio=9.0, traffic=9.0, notes=["blocker: rope: the cat"], per_call_ms=0.2,
                            floor_ms=0.1)
    assert overhead.startswith("call overhead") and overhead.endswith("; blocker: rope: the cat")


def test_a_glue_op_that_holds_gemms_is_not_blamed_on_its_bytes():
    """The H200 run's mla_qk (wq_b and wkv_b inside) read "the bytes, likely" at 7.5x its bytes ideal."""
    from phases.local_compile_perf.stack_code import blocker_text, judge_op

    reason = blocker_text(compiled=True, ratio=7.5, traffic=3.2, notes=[], per_call_ms=8.0, floor_ms=None,
                          gemm_gflop=2700.0)
    assert reason.startswith("holds GEMMs (2.7e+03 GFLOP a call)")
    op = {"op": "mla_qk", "region": "mla_qk", "compiled": True, "calls_per_step": 2, "fwd_ms": (9.0,),
          "fwdbwd_ms": (9.0,), "fwd_bytes": 10**9, "bwd_bytes": 10**9, "eager_bytes": {"fwd": 2 * 10**9, "bwd": 0},
          "device_ms": 0.5, "gemm_flops": 0}
    judged = judge_op(op, 4.0, [], floor_ms=1.0)
    # the device time of its kernels is what counts on CUDA, and a device time has no launch floor
    assert judged["timer"] == "device" and judged["measured_ms"] == 1.0
    assert judged["ratio"] == 1.0 / (2 * 2e9 / 4e12 * 1e3) and judged["blocker"] == ""
    host = judge_op({**op, "device_ms": None}, 4.0, [], floor_ms=4.0)
    assert host["timer"] == "call" and host["blocker"].startswith("call overhead")


def test_an_op_holding_gemms_is_judged_by_its_glue_kernels_on_a_device_timer():
    from phases.local_compile_perf.stack_code import judge_op

    op = {"op": "mla_qk", "region": "mla_qk", "compiled": True, "calls_per_step": 2, "fwd_ms": (9.0,),
          "fwdbwd_ms": (9.0,), "fwd_bytes": 10**9, "bwd_bytes": 10**9, "eager_bytes": {"fwd": 2 * 10**9, "bwd": 0},
          "device_ms": 8.0, "device_glue_ms": 1.0, "gemm_flops": 2 * 10**12}
    judged = judge_op(op, 4.0, [], floor_ms=None)
    ideal = 2 * 2e9 / 4e12 * 1e3
    assert judged["measured_ms"] == 16.0 and judged["glue_ms"] == 2.0 and judged["ratio"] == 2.0 / ideal
    assert judged["blocker"].startswith("its glue kernels alone (GEMM and attention kernels left out) take 2.0000 "
                                        "ms/step, 2.0x its ideal:")
    unsplit = judge_op({**op, "device_glue_ms": None, "device_ms": None}, 4.0, [], floor_ms=None)
    assert unsplit["glue_ms"] is None and unsplit["blocker"].startswith("holds GEMMs (2e+03 GFLOP a call)")


def _cell(variant, *, wall, kernel, families, glue=None):
    from phases.local_compile_perf.records import Cell

    cited = {"wall_ms": wall, "kernel_ms": kernel, "glue_ms": glue if glue is not None else kernel}
    return Cell(variant=variant, tree=variant, tokens=256, status="measured", cited=cited,
                samples={k: (v, v * 1.1, v * 0.9) for k, v in cited.items()},
                families=tuple({"family": f, "count_per_step": 1.0, "ms_per_step": ms} for f, ms in families.items()))


def test_per_step_family_times_add_up_or_say_why_not():
    from phases.local_compile_perf.profile_diff import per_step_check

    fine = per_step_check(_cell("eager", wall=100.0, kernel=95.0, families={"gemm": 60.0, "pointwise": 35.0}),
                          cuda=False)
    assert fine["holds"] and fine["why"] == ""
    slow_profile = per_step_check(_cell("eager", wall=389.6, kernel=2095.0, families={"gemm": 2000.0,
                                                                                       "pointwise": 95.0}), cuda=False)
    assert not slow_profile["holds"] and "5.38x the wall" in slow_profile["why"] and "profiler" in slow_profile["why"]
    double = per_step_check(_cell("eager", wall=100.0, kernel=90.0, families={"gemm": 80.0, "cat/copy": 30.0}),
                            cuda=True)
    assert not double["holds"] and "> kernel total" in double["why"]
    idle = per_step_check(_cell("eager", wall=100.0, kernel=50.0, families={"gemm": 50.0}), cuda=True)
    assert "kernels cover 50% of the wall" in idle["why"] and "device idle" in idle["why"]
    from orchestrator.context import render_template

    table = {"variant": "eager", "tokens": 256, "families": [{"family": "gemm", "count_per_step": 1.0,
                                                              "ms_per_step": 2000.0}], "per_step": slow_profile}
    text = render_template("local_compile_perf", "profile.md.j2", tables=[table], diffs=[])
    assert "kernel total 2095.000 ms, wall 389.600 ms (5.38x): does not add up: the kernel total" in text
    assert "- gemm: 2000.000 ms (95% of the kernel total)" in text


def test_rank_sees_glue_outside_every_region_and_the_stop_rule_says_what_it_saw():
    from phases.local_compile_perf.rank import glue_on_wall, stop_caveat, unregioned_row

    glue = glue_on_wall(120.0, 200.0, 100.0)
    outside = unregioned_row(glue, [_glue_row("a", measured=20.0), _glue_row("b", measured=10.0)])
    assert glue == 60.0 and outside == 30.0  # the glue is scaled to the wall: the profiled step ran 2x longer
    caveat = stop_caveat(1024, outside, glue, cuda=False, source="the ideal-times worker")
    assert "30.000 ms of 60.000 ms" in caveat and "from the ideal-times worker" in caveat and "indicative" in caveat
    covered = unregioned_row(glue, [_glue_row("a", measured=70.0)])
    assert covered < 0 and "none outside is seen" in stop_caveat(1024, covered, glue, cuda=True, source="x")


def test_rank_takes_the_layer_and_the_outside_glue_from_the_process_that_timed_the_ops():
    """Blind trial 2026-12-04: the outside row was the baselines' eager glue minus ops timed in another phase."""
    from types import SimpleNamespace

    from phases.local_compile_perf.rank import eager_step
    from phases.local_compile_perf.records import Baselines
    from phases.kit.records import Bandwidth
    from phases.local_compile_perf.results import IdealTimes

    bandwidth = Bandwidth(tbs=0.04, kind="host_memcpy", label="host memcpy", nbytes=1, copies=1, seconds=1.0,
                          warmup=1)
    baselines = Baselines(traps={}, rows=(_cell("eager", wall=2547.9, kernel=2000.0, glue=1406.4, families={}),),
                          gpu_poll="none", orders=())
    ctx = SimpleNamespace(result=lambda phase, model: baselines)
    same = IdealTimes(bandwidth=bandwidth, tokens=256, rows=(), regions_found=(),
                      eager_step={"wall_ms": 400.0, "kernel_ms": 500.0, "glue_ms": 250.0})
    assert eager_step(ctx, same) == (400.0, 200.0, "the ideal-times worker, beside the ops timed alone")
    without = same.model_copy(update={"eager_step": None})
    assert eager_step(ctx, without) == (2547.9, 1406.4, "the baselines' eager cell")


def _glue_row(op, *, measured=1.0, region=""):
    """An ideal-times row (ideal_times.build_gap_rows) of one glue op."""
    from phases.local_compile_perf.results import GlueRow

    return GlueRow(op=op, region=region or op.split("#")[0], calls_per_step=1, shapes=(), fwd_ms=measured, bwd_ms=0.0,
                   measured_ms=measured, ideal_ms=0.1, gap_ms=measured - 0.1, bytes=1024, eager_bytes=2048,
                   best_known_ms=None, best_known="not measured (no best-known data)")


def _ranked_op(op, *, measured, ideal, layer=410.0):
    gap = measured - ideal
    return {"op": op, "measured_ms": measured, "ideal_ms": ideal, "gap_ms": gap, "share_pct": 100 * measured / layer,
            "score_ms": gap * measured / layer, "gain_pct": 100 * gap / layer, "kept_because": ""}


def _waiting_pick_fix(tmp_path, *, ranked, dropped, stack_regions):
    """pick_fix's wait on a fake context: the rank phase's record, and one stack entry per region list."""
    from types import SimpleNamespace

    from phases.local_compile_perf.pick_fix import wait_for_agent

    repo = make_repo(tmp_path / "target", {"README": "no regions here\n"})
    tip = repo.head.commit.hexsha
    from phases.local_compile_perf.results import IdealTimes, Rank

    stop = {"stop": not ranked, "threshold": 0.01, "caveat": "", "reason": "next candidate ... at or above 1.0%"
            if ranked else "no candidate gains >= 1.0% of the 410.000 ms layer"}
    rank = Rank.model_validate({"layer_ms": 410.0, "tokens": 1024, "ranked": ranked, "dropped": dropped,
                                "unregioned_ms": 0.0, "eager_glue_ms": 0.0, "stop": stop})
    bandwidth = {"tbs": 1.0, "nbytes": 1, "copies": 1, "seconds": 1.0, "warmup": 1, "kind": "hbm", "label": "x"}
    ideal = IdealTimes(bandwidth=bandwidth, tokens=1024, rows=tuple(_glue_row(r["op"]) for r in ranked),
                       regions_found=())
    entries = [{"branch": f"stack/{n}", "commit": tip, "regions": regions} for n, regions in enumerate(stack_regions)]
    state = {"workflow": "local-compile-perf", "records": {"stack_entry": entries}, "base": {"commit": tip}}
    results = {"rank": rank, "ideal_times": ideal}
    ctx = SimpleNamespace(results=results, result=lambda phase, model: model.model_validate(results[phase]),
                          run_id="r1", target=tmp_path / "target", state=state)
    return wait_for_agent(ctx)


def test_pick_fix_counts_what_rank_recorded_and_says_the_stop_rule_now(tmp_path):
    nothing_above = _waiting_pick_fix(tmp_path / "a", ranked=[], dropped=["rope", "swiglu", "moe_combine"],
                                      stack_regions=[])
    assert "rank recorded 3 op(s) at 1024 tokens: 0 above the 1.0% cut, 3 dropped under it" in nothing_above.summary
    assert "stop rule holds at rank" in nothing_above.summary, nothing_above.summary

    ranked = [_ranked_op("rms_norm#1", measured=20.5, ideal=1.1), _ranked_op("swiglu", measured=8.4, ideal=1.0)]
    before = _waiting_pick_fix(tmp_path / "b", ranked=ranked, dropped=["rope"], stack_regions=[])
    assert "2 above the 1.0% cut, 1 dropped" in before.summary and "stop rule open at rank" in before.summary
    one = _waiting_pick_fix(tmp_path / "c", ranked=ranked, dropped=["rope"], stack_regions=[["rms_norm"]])
    assert "stop rule open after 1 stack entry: 1 ranked op outside the stack's regions (swiglu)" in one.summary
    assert one.data["stop_now"]["open_ops"] == ["swiglu"] and one.data["stop_now"]["taken_ops"] == ["rms_norm#1"]
    assert "next candidate swiglu can gain 7.400 ms" in one.issues[0].message, one.issues[0].message
    both = _waiting_pick_fix(tmp_path / "d", ranked=ranked, dropped=[], stack_regions=[["rms_norm"], ["swiglu"]])
    assert "stop rule holds after 2 stack entries: the stack's regions take every ranked op" in both.summary
    assert both.data["stop_now"]["stop"] is True and both.data["stop"]["stop"] is False  # rank's own record kept
    from phases.local_compile_perf.results import Rank
    from phases.local_compile_perf.stop_state import ranking_line

    flagged = {**_ranked_op("router", measured=1.0, ideal=0.9), "kept_because": "removes a host sync"}
    line = ranking_line(Rank.model_validate({"ranked": [flagged], "dropped": [], "tokens": 64, "layer_ms": 410.0,
                                             "unregioned_ms": 0.0, "eager_glue_ms": 0.0,
                                             "stop": {"stop": False, "reason": "", "threshold": 0.01, "caveat": ""}}))
    assert "1 above the 1.0% cut (1 of them kept under it: router removes a host sync), 0 dropped" in line


def test_the_summary_a_submit_answers_with_leads_with_the_candidates_verdict():
    """The trial of 2026-12-04: four submits answered alike; a rejection showed only through explain."""
    from phases.local_compile_perf.pick_fix import last_verdict
    from phases.local_compile_perf.results import CandidateVerdict

    rejected = CandidateVerdict(id="c2", branch="candidate/x", label="weighted combine", verdict="rejected",
                                phase="correctness", reason="TP/EP build check at world 8: FAIL " + "x" * 400,
                                kept_branch="rejected/2-x")
    line = last_verdict([rejected])
    assert line.startswith("last candidate 'weighted combine' rejected at correctness: TP/EP build check at world 8")
    assert line.endswith("... (explain has it all); ") and len(line) < 420
    assert last_verdict([]) == ""
