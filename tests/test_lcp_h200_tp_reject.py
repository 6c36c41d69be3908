"""The H200 local-compile-perf run under bench/results/2026-12-04-h200-lcp verifies on CPU.

Read from the trail: Liger-Kernel timed beside the region ops on CUDA, attention against its FLOP
floor with cuDNN's kernels, and the seven-rewrite candidate confirmed and numerically correct on one
device but rejected by the TP/EP build check at world 8. The audit holds the trail with the signer's
public key alone (no private key is in the archive).
"""

from __future__ import annotations

import json

from tests.evidence import unpacked

EVIDENCE = unpacked("2026-12-04-h200-lcp")
RUN_ID = "local-compile-perf-20261204-141133-4507"
RUN = EVIDENCE / "runs" / RUN_ID


def completed(phase: str) -> list[dict]:
    lines = (RUN / "events.jsonl").read_text().splitlines()
    return [e["data"]["data"] for e in map(json.loads, lines) if e["type"] == "phase_completed" and e["phase"] == phase]


def test_trail_audits_clean_with_the_public_key_alone(invoke, monkeypatch) -> None:
    anchors = EVIDENCE / "anchors"
    assert not (anchors / "trail.ed25519").exists() and (anchors / "trail.ed25519.pub").exists()
    monkeypatch.setenv("ORCHESTRATOR_ANCHOR_DIR", str(anchors))
    result = invoke("audit", RUN_ID, "--schema", "--state-dir", str(EVIDENCE), "--json")
    assert json.loads(result.output)["findings"] == [], result.output


def test_liger_kernels_were_timed_beside_the_ops_on_cuda() -> None:
    (plan,) = completed("plan")
    assert plan["device"].startswith("cuda") and plan["device_name"] == "NVIDIA H200"
    offers = completed("pick_fix")[0]["best_known_offers"]
    assert {o.split(":")[0] for o in offers} == {"rms_norm#1", "rms_norm#2", "rms_norm#3", "swiglu"}
    assert all("liger-kernel 0.8.5" in o for o in offers)
    ideal = (RUN / "artifacts" / "ideal_times.md").read_text()
    assert "| router | 1 |" in ideal and "no group-limited top-k router" in ideal
    assert "LigerLlama4RopeFunction (liger-kernel 0.8.5" in ideal


def test_attention_was_held_to_its_flop_floor_with_cudnn() -> None:
    (baselines,) = completed("baselines")
    rows = {a["tokens"]: a for a in baselines["attention"]}
    assert sorted(rows) == [2048, 4096, 16384]
    for row in rows.values():
        assert 1.0 < row["measured_ms"] / row["floor_ms"] < 2.5 and any("cudnn" in k for k in row["kernels"])


def test_the_stack_is_correct_on_one_device_and_rejected_at_world_8() -> None:
    state = json.loads((RUN / "run.json").read_text())
    assert state["status"] == "done" and completed("findings")[-1]["stack"] == []
    (verdict,) = state["records"]["candidate_verdict"]
    assert verdict["verdict"] == "rejected" and verdict["phase"] == "correctness"
    (correct,) = state["records"]["correctness"]
    assert all(c["ok"] for c in correct["comparisons"])
    (check,) = state["records"]["tp_ep_build_check"]
    assert check["blocking"] == ["rank_0", "rank_7"] and check["check"]["compile_backend"] == "inductor"
    assert "mixed torch.Tensor and DTensor" in check["check"]["failures"]["rank_0"]
    assert "build_qk" in check["check"]["failures"]["rank_0"]
    confirmed = completed("screen_confirm")[0]["judged"]
    assert [j["verdict"] for j in confirmed] == ["win"] * 3, confirmed
