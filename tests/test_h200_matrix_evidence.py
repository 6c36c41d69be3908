"""The H200 calls committed under bench/results/2026-12-02-h200-matrix (issue 22): trails verify on CPU.

The first call's survey rows that died of a fork which broke CUDA are `error` rows of ours, never
findings for the agent; every trail (README command 1's interrupted run too) audits clean here.
"""

from __future__ import annotations

import json

import pytest

from tests.evidence import unpacked

EVIDENCE = unpacked("2026-12-02-h200-matrix") / "first-call"
RUNS = sorted(p.name for p in (EVIDENCE / "runs").iterdir())


@pytest.mark.parametrize("run_id", RUNS)
def test_trail_audits_clean_on_cpu_anchor_included(run_id: str, invoke, monkeypatch) -> None:
    monkeypatch.setenv("ORCHESTRATOR_ANCHOR_DIR", str(EVIDENCE / "anchors"))
    result = invoke("audit", run_id, "--schema", "--state-dir", str(EVIDENCE), "--json")
    assert json.loads(result.output)["findings"] == [], result.output


def test_a_fork_that_broke_cuda_is_our_error_not_the_agents() -> None:
    rows = json.loads((EVIDENCE / "device/survey.json").read_text())["rows"]
    broken = [r for r in rows if "Cannot re-initialize CUDA in forked subprocess" in " ".join(r["reasons"])]
    assert broken and all(r["outcome"] == "error" for r in broken), rows
    for row in broken:
        state = json.loads((EVIDENCE / "runs" / row["run_id"] / "run.json").read_text())
        assert state["status"] == "failed" and state["phase"] == "numerics", state["summary"]
