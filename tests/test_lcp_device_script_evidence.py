"""The device script's whole path, run on CPU at small dims: bench/results/2026-12-05-cpu-lcp-device-script.

Issue 38's device session was lent no machine, so ``bash bench/h200_lcp.sh go`` with the device's options ran
here instead, repeated as the device calls would be, each call ending at its deadline or before a phase it could
not finish and the next continuing the run. Read from the trail and the calls' logs: the audit holds with the
signer's public key alone; the calls continued one run (a cut phase reran and read back what it had finished);
the plan and FINDINGS say what the options left out and why the sizes are below the skill's; and the bar is
read from the trail's own cells, as FINDINGS states it (indicative: a host timer, nothing to hold to the bar).
"""

from __future__ import annotations

import json

from phases.local_compile_perf.glue_bar import judge_glue_bar
from tests.evidence import unpacked

EVIDENCE = unpacked("2026-12-05-cpu-lcp-device-script")
RUN = next((EVIDENCE / "runs").iterdir())


def events() -> list[dict]:
    return [json.loads(line) for line in (RUN / "events.jsonl").read_text().splitlines()]


def record(kind: str) -> list[dict]:
    return json.loads((RUN / "run.json").read_text())["records"].get(kind, [])


def test_trail_audits_clean_with_the_public_key_alone(invoke, monkeypatch) -> None:
    anchors = EVIDENCE / "anchors"
    assert not (anchors / "trail.ed25519").exists() and (anchors / "trail.ed25519.pub").exists()
    monkeypatch.setenv("ORCHESTRATOR_ANCHOR_DIR", str(anchors))
    result = invoke("audit", RUN.name, "--schema", "--state-dir", str(EVIDENCE), "--json")
    assert json.loads(result.output)["findings"] == [], result.output


def test_one_run_went_from_plan_to_feedback_over_calls_that_continued_it() -> None:
    logs = sorted((EVIDENCE / "logs").glob("call*-log_go.txt"))
    assert len(logs) >= 2
    first, *later = [p.read_text() for p in logs]
    assert "$ orchestrator start local-compile-perf" in first and all(
        f"continuing run {RUN.name}" in text for text in later)
    assert "audit: ok=True findings=[]" in later[-1]
    state = json.loads((RUN / "run.json").read_text())
    assert state["status"] == "done" and state["answers"] == {"candidates": "done", "open_prs": "no"}
    cut = [e["phase"] for e in events() if e["type"] == "phase_interrupted"]
    assert cut, "no call was cut: the resume was not exercised"
    (verdict,) = record("candidate_verdict")
    assert verdict["verdict"] == "validated" and verdict["label"].endswith("+ rope-in-place + router-topk")


def test_the_plan_and_findings_say_what_was_left_out_and_why_the_sizes() -> None:
    plan = (RUN / "artifacts" / "plan.md").read_text()
    findings = (RUN / "artifacts" / "FINDINGS.md").read_text()
    assert "2 warm-up, 6 timed, 2 profiled" in plan and "the whole workflow in one 30-minute device session" in plan
    assert "per-rewrite deltas left out (--rewrite-deltas no)" in plan
    for part in ("--per-layer-stack no", "--rewrite-deltas no"):
        assert part in plan and part in findings
    assert record("rewrite_deltas") == []
    (stack,) = record("stack_code")
    assert {r["variant"] for r in stack["rows"]} == {"upstream_main", "per_layer_main", "regions_stack"}
    assert {r["name"] for r in stack["cold_compile"]["rows"]} >= {"router", "mla_qk", "rope_in_place", "per_layer"}
    assert stack["under_ac"]["mode"] == "selective"


def test_the_bar_read_from_the_trail_is_the_one_findings_states() -> None:
    (stack,) = record("stack_code")
    bar = judge_glue_bar(stack["per_tokens"], stack["ops"], glue_tokens=stack["glue_tokens"])
    findings = (RUN / "artifacts" / "FINDINGS.md").read_text()
    verdict = "met" if bar["met"] else "not met"
    assert f"wall not above it: {verdict} (indicative: host timer)." in findings
    for row in bar["rows"]:
        assert f"| {row['tokens']} | {row['main_glue_ms']:.3f} / {row['main_wall_ms']:.3f} | " \
               f"{row['stack_glue_ms']:.3f} / {row['stack_wall_ms']:.3f} | {row['glue_pct']:+.1f}% |" in findings
