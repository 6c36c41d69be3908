"""The H200 local-compile-perf run under bench/results/2026-11-30-lcp-h200 verifies on CPU.

The trail key and signed heads travelled with the run (``anchors/``), so the audit checks the
anchor too. The issue's goal is read from the trail, not from the markdown: the stack's glue
at least 20% under per-layer compile at 4096 and 16384 tokens, wall at or below it, and the
candidate through graph budget, confirmation and correctness.
"""

from __future__ import annotations

import json

import pytest

from tests.evidence import unpacked

EVIDENCE = unpacked("2026-11-30-lcp-h200")
RUN_ID = "local-compile-perf-20261130-092811-09ad"
RUN = EVIDENCE / "runs" / RUN_ID


def events() -> list[dict]:
    return [json.loads(line) for line in (RUN / "events.jsonl").read_text().splitlines()]


def findings_per_tokens() -> dict[int, dict]:
    done = [e for e in events() if e["type"] == "phase_completed" and e["phase"] == "findings"
            and e["data"]["data"].get("per_tokens")]
    return {row["tokens"]: row for row in done[-1]["data"]["data"]["per_tokens"]}


def test_trail_audits_clean_on_cpu_anchor_included(invoke, monkeypatch) -> None:
    monkeypatch.setenv("ORCHESTRATOR_ANCHOR_DIR", str(EVIDENCE / "anchors"))
    result = invoke("audit", RUN_ID, "--schema", "--state-dir", str(EVIDENCE), "--json")
    assert json.loads(result.output)["findings"] == [], result.output


@pytest.mark.parametrize("tokens", [4096, 16384])
def test_stack_glue_is_a_fifth_under_per_layer_compile_and_wall_not_above(tokens: int) -> None:
    row = findings_per_tokens()[tokens]
    assert row["stack"]["glue_ms"] <= 0.8 * row["per_layer"]["glue_ms"], row
    assert row["stack"]["wall_ms"] <= row["per_layer"]["wall_ms"], row


def test_the_stack_passed_every_check_on_cuda() -> None:
    state = json.loads((RUN / "run.json").read_text())
    (plan,) = [e["data"]["data"] for e in events() if e["type"] == "phase_completed" and e["phase"] == "plan"]
    assert state["status"] == "done" and plan["device"].startswith("cuda"), plan["device"]
    (verdict,) = state["records"]["candidate_verdict"]
    assert verdict["verdict"] == "validated", verdict
    assert "latent-proj" in verdict["label"] and "rope-in-place" in verdict["label"], verdict["label"]
    (graphs,) = state["records"]["graph_count"]
    assert max(graphs["per_region"].values()) <= graphs["target"] and not graphs["limit_hit"]
    (correct,) = state["records"]["correctness"]
    labels = " ".join(c["label"] for c in correct["comparisons"])
    assert all(c["ok"] for c in correct["comparisons"]) and all(d in labels for d in ("bf16", "fp32", "fp64"))
    assert correct["routing_replayed"] == ["1.ffn.router"]


def test_the_diagnostic_deltas_in_the_readme_are_the_logged_ones() -> None:
    """Each prefix's glue quoted in the README is the family sum of its logged profile."""
    text = (EVIDENCE / "README.md").read_text()
    for run in json.loads((EVIDENCE / "logs/2-diag.json").read_text()):
        for tokens in ("4096", "16384"):
            result = run["result"][tokens]
            glue = sum(f["ms_per_step"] for f in result["kernels"]["families"]
                       if f["family"] not in ("gemm", "attention"))
            assert f"{glue:.3f}" in text, (run["name"], tokens, glue)
