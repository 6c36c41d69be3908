"""The 8 upstream models on torchtitan main, CPU, 2026-12-06 (bench/results/2026-12-06-add-moe-main): every trail
audits intact against the pinned key, and what its README says is read back from the runs themselves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.trail_archives import audit_pinned, snapshots_by_model, unpack


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack("2026-12-06-add-moe-main", tmp_path_factory.mktemp("main-tree"))


def test_every_run_audits_intact_against_the_pinned_key(unpacked: Path) -> None:
    audited = audit_pinned(unpacked)
    assert audited.returncode == 0, audited.stdout[-2000:]
    assert json.loads(audited.stdout)["ok"]


def test_seven_are_done_and_gemma_waits_at_the_probe_with_both_its_layer_kinds_built(unpacked: Path) -> None:
    runs = snapshots_by_model(unpacked)
    assert len(runs) == 8
    gemma = runs.pop("google/gemma-4-26B-A4B")
    assert {s["status"] for s in runs.values()} == {"done"}
    assert (gemma["status"], gemma["phase"]) == ("waiting", "probe")
    assert "2 layer kinds" in gemma["summary"] and "each built and checked" in gemma["summary"]


def test_each_gap_analysis_ends_at_zero_with_the_row_that_measured_it(unpacked: Path) -> None:
    gaps = {model: s["results"]["gap_analysis"] for model, s in snapshots_by_model(unpacked).items()
            if "gap_analysis" in s["results"]}
    assert len(gaps) == 6 and "allenai/OLMoE-1B-7B-0924" not in gaps
    for model, gap in gaps.items():
        rows = {row["label"]: row for row in gap["rows"]}
        assert rows["baseline"]["max_diff"] > 0, model
        assert rows["trace"]["trace"]["first_divergence"] == "router logits", model
        assert rows["+fp32 router gate"]["max_diff"] == 0.0, model
        assert gap["explanation"].startswith("max_diff 0.00 from row '+fp32 router gate'"), model


def test_the_synthetic_entry_holds_one_layer_of_every_kind(unpacked: Path) -> None:
    for model, s in snapshots_by_model(unpacked).items():
        if "synthetic_config" not in s["results"]:
            continue
        config = s["results"]["synthetic_config"]
        kinds = {layer["kind"] for layer in config["layers"]}
        assert config["entry"]["num_hidden_layers"] == len(config["layers"]) == len(kinds), model
