"""Gap analysis on CPU ends at max_diff 0.00 with every patch measured, on real models an agent fixed.

Issue 37's blind trial: for deepseek_v32, hunyuan_v1_moe, exaone_moe and bailing_hybrid the gap table and
MODEL_COMPATIBILITY.md said the residual was "in the router ... the fp32 comparison differs too, so the fp32
router autocast is not its cause: ..., accepted on CPU without a trace", a cause no row measured, and the
fp32 comparison was not fp32 on Titan's side. Each case starts a real run on the embedded torchtitan 0.3.0
workspace, applies the experiment-folder fixes of tests/moe_reference_fixes*.py an agent writes for the
probe's findings, and advances through numerics and the gap analysis, where it stops (``max_phases``): the
three recipes, the stage trace, the hypothesis patch it points to, each measured in a fresh process.
The three cover a sigmoid router with a correction bias, expert groups and shared experts (deepseek_v32), one
with a single group and a sliding-window attention layer (exaone_moe), and glm4_moe_lite (MLA attention, a bf16
FAIL in the blind trial of 2026-12-05). qwen3_next was the third until its synthetic entry held one layer of each
kind: its numerics is PASS since, so no gap analysis runs for it. hunyuan_v1_moe (softmax, gate.wg, shared_mlp) ends
the same way (0.00 after the fp32 router gate) but costs 13 minutes on a shared 2-core machine, so it is not here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from orchestrator import engine
from orchestrator.trail.store import RunStore
from tests import moe_reference_fixes as fixes

pytestmark = pytest.mark.slow
CASES = {
    "deepseek_v32": (fixes.expert_bias_key_renamed,),
    "exaone_moe": (fixes.expert_bias_key_renamed,),
    "glm4_moe_lite": (fixes.expert_bias_key_renamed,),
}
UNMEASURED_CAUSE = re.compile(r"accepted|without a trace|\blikely\b|\bprobably\b|is not its cause")


@pytest.fixture(scope="module", params=sorted(CASES))
def gap_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    store = RunStore(tmp_path_factory.mktemp(f"gap-{request.param}") / "state")
    run_id = engine.start("add-moe-model", {"model": f"type:{request.param}", "branch": "current", "commit": "never",
                                            "unrun_rows": "accept", "device": "cpu"}, store=store).run_id
    target = Path(engine.advance(run_id, store=store).state["target"])  # stops at the probe's findings
    fixes.apply(target, CASES[request.param])
    state = engine.advance(run_id, store=store, max_phases=4).state  # probe, synthetic, numerics, gap analysis
    events = store.read_events(run_id)
    return {"model": request.param, "state": state, "events": events, "run_id": run_id,
            "artifacts": store.runs_dir / run_id / "artifacts"}


def _completed(run: dict, phase: str) -> dict:
    return next(e for e in reversed(run["events"]) if e["type"] == "phase_completed" and e["phase"] == phase)


def test_gap_analysis_ends_at_zero_with_every_patch_measured_and_reverted(gap_run: dict) -> None:
    verdict = _completed(gap_run, "numerics")["data"]["data"]["verdict"]
    assert verdict["status"] in ("WARN", "FAIL"), verdict  # the gap analysis is mandatory
    gap = _completed(gap_run, "gap_analysis")
    assert gap["data"]["outcome"] == "passed", gap["data"]
    rows = gap["data"]["data"]["rows"]
    assert rows[0]["label"] == "baseline" and rows[0]["max_diff"] == verdict["max_diff"] > 0.0
    assert rows[-1]["max_diff"] == 0.0 and rows[-1]["patch_id"], rows[-1]
    applied = {e["data"]["patch_id"] for e in gap_run["events"] if e["type"] == "patch_applied"}
    assert applied == {r["patch_id"] for r in rows if r.get("patch_id")}
    reverted = {p for e in gap_run["events"] if e["type"] == "patch_reverted" for p in e["data"]["patch_ids"]}
    assert reverted == applied and gap["data"]["data"]["reverted"]
    artifacts = gap_run["artifacts"]
    for row in rows:
        assert not row["log"] or (artifacts / row["log"]).is_file(), row
    table = (artifacts / "gap_table.md").read_text()
    assert "| final | 0.00e+00 |" in table


def test_the_trace_measures_every_stage_and_the_closing_patch_tests_its_first_divergence(gap_run: dict) -> None:
    rows = _completed(gap_run, "gap_analysis")["data"]["data"]["rows"]
    traces = [r for r in rows if r["label"] == "trace"]
    assert traces, rows
    last = traces[-1]
    stage = {s["stage"]: s for s in last["trace"]["stages"]}
    first = last["first_divergence"]
    assert first and stage[first]["max_diff"] > 0.0
    before = list(stage)[:list(stage).index(first)]
    assert all(stage[s]["max_diff"] == 0.0 for s in before)
    closing = rows[-1]
    assert rows.index(closing) > rows.index(last) and first in closing["description"]
    measured = [e["data"] for e in gap_run["events"] if e["type"] == "measurement_recorded"
                and e["data"]["name"] == "gap_stage_max_diff" and e["data"]["labels"]["table"] == last["trace_table"]]
    assert sorted(m["labels"]["stage"] for m in measured) == sorted(s for s, row in stage.items()
                                                                    if row["max_diff"] is not None)
    assert (gap_run["artifacts"] / last["trace_table"]).read_text().count("\n| ") == 1 + len(stage)


def test_no_gap_text_states_a_cause_no_row_measured(gap_run: dict) -> None:
    gap = _completed(gap_run, "gap_analysis")["data"]
    texts = [gap["summary"], (gap_run["artifacts"] / "gap_table.md").read_text()]
    texts += [r["description"] for r in gap["data"]["rows"]]
    assert [t for t in texts if UNMEASURED_CAUSE.search(t)] == []


def test_the_fp32_diagnostic_names_the_ops_that_did_not_run_in_fp32(gap_run: dict) -> None:
    data = _completed(gap_run, "numerics")["data"]["data"]
    fp32 = next(r for r in data["results"] if r["dtype"] == "float32")
    below = fp32["matmuls_below_run_dtype"]
    assert below["hf"] == [] and {(r["module"], r["op"]) for r in below["titan"]} == {
        ("routed_experts.inner_experts", "_grouped_mm")}, below
    (reading,) = data["diagnostic_readings"]
    assert "NOT float32 on both sides (Titan: routed_experts.inner_experts ran _grouped_mm in bfloat16" in reading
    assert f"max_diff {fp32['max_diff']:.2e}" in reading and "agrees" not in reading
    assert reading in (gap_run["artifacts"] / "numerics.txt").read_text()
    assert json.dumps(data["verdict"]["matmuls_below_run_dtype"]) == json.dumps({"hf": [], "titan": []})


# An agent's slip the probe's routing check lets through (it compares weights to rtol 1e-4): the route scale off by
# one part in 16384. Nothing built in tests a routing rule, so the residual is the agent's, then a person's.
SCALE = '    route_scale = getattr(config, "routed_scaling_factor", 1.0)\n\n    # Group-limited routing'
SCALE_SLIP = ('    route_scale = getattr(config, "routed_scaling_factor", 1.0) * (1 + 2**-14)\n\n'
              '    # Group-limited routing')


def test_a_residual_no_hypothesis_explains_waits_naming_its_stage_and_a_waiver_ends_it_not_explained(
        tmp_path: Path) -> None:
    store = RunStore(tmp_path / "state")
    run_id = engine.start("add-moe-model", {"model": "type:exaone_moe", "branch": "current", "commit": "never",
                                            "unrun_rows": "accept", "device": "cpu"}, store=store).run_id
    target = Path(engine.advance(run_id, store=store).state["target"])
    fixes.apply(target, (fixes.expert_bias_key_renamed,))
    fixes.replace_once(target, fixes.MOE, SCALE, SCALE_SLIP)
    waiting = engine.advance(run_id, store=store, max_phases=4)
    state = waiting.state
    assert (state["phase"], state["awaiting"], waiting.exit_code) == ("gap_analysis", "agent", 4), state["summary"]
    (issue,) = state["issues"]
    assert issue["code"] == "residual_gap_unexplained"
    assert "not explained: the stage trace's first divergence is routing (max_diff" in issue["message"]
    assert "kind patch {diff, label}" in issue["message"] and f"orchestrator patch {run_id}" in issue["message"]
    rows = state["records"]["gap_row"]
    assert [r["label"] for r in rows if r["label"] == "+fp32 router gate"], rows  # the router's dtype went first
    assert rows[-1]["label"] == "trace" and rows[-1]["first_divergence"] == "routing" and rows[-1]["max_diff"] > 0
    assert not rows[-1]["kernel_verified"] and state["open_patches"]
    assert "rows measured: baseline " in state["summary"] and "+fp32 router gate " in state["summary"], \
        state["summary"]  # an agent's submit reply carries each patch's own numbers

    engine.resume(run_id, {}, store=store, advance_after=False, waivers={
        "residual_gap_unexplained": "route scale slip left in on purpose (test)"})
    passed = engine.advance(run_id, store=store, max_phases=1).state
    gap = next(e for e in reversed(store.read_events(run_id)) if e["type"] == "phase_completed"
               and e["phase"] == "gap_analysis")["data"]
    assert gap["outcome"] == "passed" and not passed["open_patches"]
    last = gap["data"]["rows"][-1]
    assert last["label"] == "not explained" and "first divergence is routing" in last["description"]
    assert "route scale slip left in on purpose (test)" in gap["data"]["explanation"]
    table = (store.runs_dir / run_id / "artifacts" / "gap_table.md").read_text()
    assert "| not explained |" in table and not UNMEASURED_CAUSE.search(table)
