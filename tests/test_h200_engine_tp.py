"""The H200 host's numbers under bench/results/2026-12-04-h200-engine-tp: the trail's write cost with
libsodium beside OpenSSL in the same runs, and the seven-rewrite stack through the TP/EP build check
with Inductor."""

from __future__ import annotations

import json
import re

from tests.evidence import unpacked

EVIDENCE = unpacked("2026-12-04-h200-engine-tp")


def ratio(text: str, label: str) -> float:
    return float(re.search(label + r"[^\n]*?-> ([0-9.]+) of the floor", text).group(1))


def test_one_signed_write_per_event_holds_half_the_floor_and_beats_openssl() -> None:
    for name in ("bench_engine_1.txt", "bench_engine_2.txt"):
        text = (EVIDENCE / name).read_text()
        ours, openssl = ratio(text, "append, one signed write per event"), ratio(text, "signed through OpenSSL")
        assert ours >= 0.5 and ours > openssl, (name, ours, openssl)
        assert float(re.search(r"-> ([0-9.]+)x \(goal <= 2x\)", text).group(1)) <= 2
        assert float(re.search(r"audit of 100,000 events: ([0-9.]+) s", text).group(1)) <= 2


def test_the_stack_passes_the_build_check_at_world_8_with_inductor() -> None:
    check = json.loads((EVIDENCE / "tp_ep_stack_inductor.json").read_text())
    assert check["backend"] == "inductor" and check["status"] == "PASS" and check["blocking"] == []
    assert check["rewrites"].split(",") == ["norm-rope-cat", "narrow-scores", "gather-combine", "mlp-swiglu",
                                            "residual-norm", "latent-proj", "rope-in-place"]
    assert max(check["graphs"].values()) <= 4 and not any(check["zero_token_growth"].values())
