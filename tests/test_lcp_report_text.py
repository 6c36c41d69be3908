"""FINDINGS.md and the PR texts from small hand-built records: what a reader of the blind trial
(bench/results/2026-12-04-blind-trial-lcp) could not tell from them."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.context import render_template
from phases.local_compile_perf.findings import asked, rejections
from phases.local_compile_perf.pr_lint import lint_pr_text
from tests.conftest import make_repo

SETTINGS = Path(__file__).resolve().parent.parent / "phases/local_compile_perf/embedded/moe_layer/trainer_settings.py"


def judged(tokens, stack, candidate, noise, verdict="indicative"):
    return {"tokens": tokens, "metric": "wall_ms", "stack": stack, "candidate": candidate,
            "delta_pct": (candidate - stack) / stack * 100, "noise_band_pct": noise, "verdict": verdict}


def summary(device="cpu", *, rejected=(), asked_lines=()):
    spec = SimpleNamespace(name="embedded:moe_layer", layer_kinds=("dense", "moe"), ac_mode="none",
                           fp32_precision="tf32")
    entry = {"position": 1, "branch": "stack/1-weighted-combine", "label": "weighted combine", "candidate": "c4-431c",
             "source_branch": "wc", "regions": ["weighted_combine"], "stack_regions_before": ["router"],
             "recipe_edit": "examples/moe_layer/trainer_settings.py",
             "files": ["examples/moe_layer/moe.py", "examples/moe_layer/trainer_settings.py"],
             "judged": [judged(256, 191.926, 189.841, 26.8), judged(512, 438.873, 390.961, 53.9),
                        judged(1024, 1115.742, 912.150, 128.7)], "replay": [],
             "correctness": [{"label": "bf16", "worst_rel_l2": 1e-3}],
             "graphs": {"per_region": {"weighted_combine": 2}, "tokens": [256, 512, 1024], "limit": 8, "target": 6}}
    if device != "cpu":
        entry["judged"] = [{**j, "verdict": "win"} for j in entry["judged"]]
    s = {"run_id": "lcp-r1", "plan": SimpleNamespace(spec=spec, device=device, device_name="host"), "entries": [entry],
         "per_tokens": [], "rejected": list(rejected), "limits": [], "not_tested": ["x"], "feedback": [],
         "linear": True, "runs": 3, "bandwidth": {"tbs": 0.04, "kind": "host memcpy"}, "glue_bar_pct": 30.0,
         "asked": {entry["branch"]: list(asked_lines)}}
    return s, entry


CONFIRMED = [judged(256, 100.0, 77.1, 26.8), judged(512, 100.0, 59.5, 53.9)]
REJECTED = {"id": "c3-aa", "label": "residual norm", "branch": "candidate/rn", "phase": "correctness",
            "reason": "fp32: out rel L2 0.1 > tol 0.01", "numbers": {"confirmed": CONFIRMED}, "regions": []}


def test_findings_stack_lines_name_their_own_session_and_on_a_host_timer_are_indicative_with_noise():
    s, _ = summary(rejected=[REJECTED])
    text = render_template("local_compile_perf", "findings.md.j2", s=s)
    header = next(line for line in text.splitlines() if line.startswith("stack (order"))
    assert "its own confirmation session" in header and "not to be set against them" in header
    assert "512 438.873 -> 390.961 ms (-10.9%, indicative, noise 53.9%)" in text
    assert "1024 1115.742 -> 912.150 ms (-18.2%, indicative, noise 128.7%)" in text
    assert ("confirmed first (wall_ms vs the stack, median of 3): 256 tokens -22.9% (indicative, noise 26.8%), "
            "512 tokens -40.5% (indicative, noise 53.9%)") in text
    gpu = render_template("local_compile_perf", "findings.md.j2", s=summary("cuda", rejected=[REJECTED])[0])
    assert "512 438.873 -> 390.961 ms (-10.9%, win)" in gpu and "indicative" not in gpu


def _verdict(id_, label, phase, reason):
    from phases.local_compile_perf.results import CandidateVerdict

    return CandidateVerdict(id=id_, branch=f"b/{id_}", label=label, verdict="rejected", phase=phase, reason=reason,
                            kept_branch=None)


def test_pr_asks_each_rejection_once_and_calls_its_own_rejections_earlier_attempts():
    from phases.local_compile_perf.records import Candidate

    budget = "graphs per region over the headroom target 6 of 8: rope 8"
    verdicts = [_verdict("c1", "weighted combine", "graph_budget", budget),
                _verdict("c2", "weighted combine", "correctness", "rank_0 (ValueError)"),
                _verdict("c3", "weighted combine", "correctness", "rank_0 (ValueError)"),
                _verdict("c5", "real rope", "graph_budget", budget)]
    submissions = [Candidate(id=f"c{n}", branch="b", label="x", regions=("rope",) if n in (1, 5) else (),
                             actor="agent", submitted_at="t") for n in range(1, 6)]
    rejected = rejections(verdicts, submissions)
    s, entry = summary()
    lines = asked(rejected, {**entry, "candidate": "c4"}, {c.id: n for n, c in enumerate(submissions)})
    assert lines == [f"earlier attempt of this rewrite: rejected at graph_budget: {budget} (the submission named "
                     "regions: rope)",
                     "earlier attempt of this rewrite: rejected at correctness: rank_0 (ValueError)",
                     f"why not real rope? rejected at graph_budget: {budget} (the submission named regions: rope)"]
    s["rejected"], s["asked"][entry["branch"]] = rejected, lines
    pr = render_template("local_compile_perf", "pr.md.j2", s=s, e=entry, findings="")
    assert "why not weighted combine?" not in pr and pr.count("earlier attempt of this rewrite") == 2
    assert lint_pr_text(pr) == []


def test_a_later_pr_leaves_the_rejected_attempts_of_an_earlier_stack_entry_to_that_entry_s_pr():
    """Blind trial of 2026-12-05: PR 2 asked "why not weighted combine?" although weighted combine is stack entry 1."""
    budget = "graphs per region over the headroom target 6 of 8: rms_norm 7"
    verdicts = [_verdict("c1", "weighted combine", "graph_budget", budget),
                _verdict("c3", "real rope", "correctness", "fp32: out rel L2 0.1 > tol 0.01")]
    rejected = rejections(verdicts, [])
    order = {"c1": 0, "c2": 1, "c3": 2, "c4": 3}
    first = {"label": "weighted combine", "candidate": "c2"}
    second = {"label": "fused rms norm", "candidate": "c4"}
    stacked = frozenset({first["label"], second["label"]})
    real_rope = "why not real rope? rejected at correctness: fp32: out rel L2 0.1 > tol 0.01"
    assert asked(rejected, second, order, stacked) == [real_rope]
    assert asked(rejected, first, order, stacked) == [f"earlier attempt of this rewrite: rejected at graph_budget: "
                                                      f"{budget}", real_rope]


def test_pr_tldr_and_cost_today_give_every_judged_count_and_problem_two_names_only_code_files():
    """Blind trial of 2026-12-05: a TLDR citing only 1024 tokens (-17.0%) read as a gain where 256 and 512 went up."""
    s, entry = summary()
    entry["judged"] = [judged(256, 119.476, 203.416, 26.8), judged(512, 375.538, 453.159, 53.9),
                       judged(1024, 913.993, 758.990, 128.7)]
    pr = render_template("local_compile_perf", "pr.md.j2", s=s, e=entry, findings="")
    assert pr.splitlines()[0].endswith("; 256 / 512 / 1024 tokens: +70.3% / +20.7% / -17.0% per step (host timer: "
                                       "indicative, not a measured gain)."), pr.splitlines()[0]
    assert "4. Cost today at 256 / 512 / 1024 tokens: 119.476 / 375.538 / 913.993 ms per fwd+bwd step" in pr
    assert "2. The glue in examples/moe_layer/moe.py runs as separate eager kernels" in pr
    assert "Files: examples/moe_layer/moe.py, examples/moe_layer/trainer_settings.py." in pr
    assert "why not a bigger region?" in pr and lint_pr_text(pr) == []


@pytest.mark.parametrize("regions", [("weighted_combine",), ("swiglu", "rope")])
def test_the_recipe_docstring_stays_true_after_a_stack_entry_enables_regions(tmp_path, regions):
    from phases.local_compile_perf.stack import enable_in_recipe, recipe_regions
    from phases.local_compile_perf.tree_adapter import EMBEDDED_SETTINGS

    repo = make_repo(tmp_path / "t", {str(EMBEDDED_SETTINGS): SETTINGS.read_text()})
    assert enable_in_recipe(Path(repo.working_dir), regions) == str(EMBEDDED_SETTINGS)
    enabled = recipe_regions(Path(repo.working_dir))
    assert enabled == ("router", *regions)
    body = ast.parse((Path(repo.working_dir) / EMBEDDED_SETTINGS).read_text()).body
    at = next(n for n, node in enumerate(body) if isinstance(node, ast.AnnAssign)
              and node.target.id == "UPSTREAM_REGIONS")
    doc = body[at + 1].value.value
    assert not any(name in doc for name in enabled) and "only" not in doc, doc


def test_the_stop_line_says_the_outside_glue_row_is_not_re_measured_after_an_entry():
    """Blind trial 2026-12-04: after an entry, stop_now kept rank's 1401 ms outside row open with no word on it."""
    from phases.local_compile_perf.rank import UNREGIONED
    from phases.local_compile_perf.stop_state import StopNow, stop_line

    now = StopNow(stop=False, reason="open", open_ops=(UNREGIONED,), taken_ops=(), entries=1)
    line = stop_line(now)
    assert line.startswith("stop rule open after 1 stack entry: 1 ranked op outside the stack's regions "
                           f"({UNREGIONED})")
    assert "not re-measured after an entry" in line
    before = StopNow(stop=False, reason="open", open_ops=("swiglu",), taken_ops=(), entries=1)
    assert "re-measured" not in stop_line(before)


def test_the_stack_code_reading_moves_glue_and_wall_together():
    """Blind trial 2026-12-04: 'the rewrites move per-layer compile's glue -3.5%' while the walls moved -34%."""
    from phases.local_compile_perf.records import Cell
    from phases.local_compile_perf.stack_code import compare_trees

    def cell(variant: str, glue: float, wall: float) -> Cell:
        return Cell(variant=variant, tree=variant, tokens=512, status="measured",
                    cited={"glue_ms": glue, "wall_ms": wall, "kernel_ms": wall})

    rows = [cell("upstream_main", 300.0, 500.0), cell("per_layer_main", 177.1, 391.1),
            cell("per_layer_stack", 170.9, 257.3), cell("regions_stack", 256.8, 501.7)]
    reading = compare_trees(rows, 512)["reading"]
    assert reading == ("the rewrites move per-layer compile's glue -3.5% and its wall -34.2% (main -> stack code); "
                       "regions vs per-layer compile of the same code: glue +50.3%, wall +95.0%")


def test_the_guidance_cites_no_pattern_list_the_agent_cannot_read():
    """Blind trial of 2026-12-05: 'read_file patterns.md' failed and "(pattern 6)" pointed at nothing."""
    import re

    from phases.local_compile_perf.pick_fix import LADDER
    from phases.local_compile_perf.profile_diff import SYMPTOMS

    for text in (*LADDER, *SYMPTOMS.values()):
        assert not re.search(r"patterns?(\.md| \d)", text), text
    assert "real arithmetic" in LADDER[2] and "gathers" in SYMPTOMS["scatter/gather"]


def test_the_bandwidth_reads_the_same_in_every_report():
    """Blind trial of 2026-12-05: "0.01 TB/s" in the advance summary and FINDINGS, "0.007 TB/s" in ideal_times.md."""
    from phases.local_compile_perf.ideal_times import tb_per_s

    s, _ = summary()
    s["bandwidth"]["tbs"] = 0.0071234
    findings = render_template("local_compile_perf", "findings.md.j2", s=s)
    bandwidth = {"tbs": 0.0071234, "label": "host", "nbytes": 1, "copies": 1, "seconds": 1.0}
    ideal = render_template("local_compile_perf", "ideal.md.j2", bandwidth=bandwidth, rows=[], tokens=8,
                            device_name="host")
    assert tb_per_s(0.0071234) == "0.00712 TB/s" and tb_per_s(4.8) == "4.8 TB/s"
    assert "bandwidth 0.00712 TB/s (host memcpy)" in findings and "Bandwidth: 0.00712 TB/s (host;" in ideal


def test_the_screen_devlog_line_says_its_token_count(monkeypatch):
    """Blind trial of 2026-12-05: "screen of 'weighted combine' (...): base_regions 47.914 ms, ..." named no count."""
    from phases.local_compile_perf import screen_confirm
    from phases.local_compile_perf.screen_confirm import screen

    monkeypatch.setattr(screen_confirm, "call_kept", lambda ctx, worker, request, *, label: ctx.call(label=label))

    notes = []
    answer = SimpleNamespace(samples_ms={"base_regions": [47.914], "with_candidate": [170.380]})
    ctx = SimpleNamespace(call=lambda *a, label: answer, note=lambda text, kind: notes.append(text))
    plan = SimpleNamespace(harness="examples.moe_layer.harness:build_harness", device="cpu", tokens=(256, 512, 1024),
                           timing=SimpleNamespace(iters=20))
    prepared = SimpleNamespace(stack_regions=("router",), tree_regions=["router", "weighted_combine"],
                               candidate_checkout="/nowhere")
    screen(ctx, plan, SimpleNamespace(label="weighted combine", prepared=prepared))
    assert notes == ["screen of 'weighted combine' at 512 tokens (ranking only, 1 process, rotated): "
                     "base_regions 47.914 ms, with_candidate 170.380 ms"]


def test_the_pr_test_plan_names_what_a_reviewer_of_the_target_can_run_or_read():
    """Blind trial of 2026-12-05: the test plan cited `pytest tests/test_lcp_workflow_e2e.py`, the orchestrator's
    own test, which a reviewer of the target cannot run against this change."""
    s, entry = summary()
    pr = render_template("local_compile_perf", "pr.md.j2", s=s, e=entry, findings="")
    plan = pr.split("**Test plan**", 1)[1].split("<details>", 1)[0].strip().splitlines()
    assert "pytest" not in pr and len(plan) == 3, plan
    assert plan[0].startswith("- `orchestrator audit lcp-r1`: ")
    assert plan[1].startswith("- `correctness-c4-431c.md` in the run's artifacts: ")
    assert plan[2].endswith("tokens 256,512,1024 + no_grad (the run's graph_budget phase): weighted_combine 2 "
                            "(limit 8, target 6)")
    assert lint_pr_text(pr) == []
