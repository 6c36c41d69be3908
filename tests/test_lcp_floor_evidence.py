"""The H200 check of the attention floor and cold compile (bench/results/2026-12-03-h200-lcp-floor-engine):
the floor is the counted FLOPs at the measured GEMM rate, the backend the profile names is cuDNN's fused SDPA,
each region's cold compile was measured, and the README cites these numbers."""

from __future__ import annotations

import json

import pytest

from tests.evidence import unpacked

EVIDENCE = unpacked("2026-12-03-h200-lcp-floor-engine")


@pytest.fixture(scope="module")
def measured() -> dict:
    return json.loads((EVIDENCE / "lcp24_cuda.json").read_text())


def test_the_floor_is_the_counted_flops_at_the_rate_measured_on_the_h200(measured):
    rate = measured["gemm_rate"]
    assert "H200" in rate["label"]
    assert rate["tflops"] == pytest.approx(2 * 8192**3 * rate["reps"] / rate["seconds"] / 1e12)
    assert [a["tokens"] for a in measured["attention"]] == [4096, 16384]
    for row in measured["attention"]:
        assert row["floor_ms"] == pytest.approx(row["flops_fwdbwd"] / (rate["tflops"] * 1e12) * 1e3)
        assert row["ratio"] == pytest.approx(row["measured_ms"] / row["floor_ms"])
        assert any("sdpa" in k and "flash" in k for k in row["kernels"]) and "math path" not in row["note"]
    # four times the tokens, sixteen times the causal pairs
    small, large = measured["attention"]
    assert large["flops_fwdbwd"] / small["flops_fwdbwd"] == pytest.approx(16, rel=1e-3)


def test_each_region_and_per_layer_compile_were_compiled_cold(measured):
    rows = {r["name"]: r for r in measured["cold_compile"]}
    assert set(rows) == {"rms_norm", "router", "per_layer"}
    assert all(r["status"] == "measured" and r["compile_s"] > 1 for r in rows.values())
    readme = (EVIDENCE / "README.md").read_text()
    for name, r in rows.items():
        assert f"{r['compile_s']:.1f} s" in readme, name
