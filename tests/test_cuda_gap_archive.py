"""add-moe-model on one H100 (CUDA), 2026-12-06 (bench/results/2026-12-06-add-moe-cuda): the trails audit intact
against the pinned key, a run waiting inside gap analysis included, and what the README says is read back from
the runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.trail_archives import audit_pinned, snapshots_by_model, unpack


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack("2026-12-06-add-moe-cuda", tmp_path_factory.mktemp("cuda"))


def test_the_trails_audit_intact_and_the_waiting_runs_open_patches_are_notes(unpacked: Path) -> None:
    audited = audit_pinned(unpacked)
    assert audited.returncode == 0, audited.stdout[-2000:]
    runs = {r["run_id"]: r for r in json.loads(audited.stdout)["runs"]}
    waiting = snapshots_by_model(unpacked)["type:cohere2_moe"]
    assert len(waiting["open_patches"]) == 3
    notes = [n for n in runs[waiting["run_id"]]["notes"] if "temporary patch" in n]
    assert len(notes) == 3 and all("waits in phase gap_analysis" in n for n in notes)


def test_mixtral_gap_closes_at_zero_on_cuda_with_the_combine_recipe(unpacked: Path) -> None:
    run = snapshots_by_model(unpacked)["type:mixtral"]
    assert run["status"] == "done"
    assert {r["device"] for r in run["results"]["numerics"]["results"]} == {"cuda"}
    rows = run["results"]["gap_analysis"]["rows"]
    assert rows[0]["max_diff"] > 0 and rows[-1]["label"] == "+fp32 combine accumulation"
    assert rows[-1]["max_diff"] == 0.0


def test_cohere2_moe_residual_is_not_explained_and_the_trace_places_it_in_the_routing_weights(unpacked: Path) -> None:
    run = snapshots_by_model(unpacked)["type:cohere2_moe"]
    assert (run["phase"], run["status"], run["awaiting"]) == ("gap_analysis", "waiting", "agent")
    assert [i["code"] for i in run["issues"]] == ["residual_gap_unexplained"]
    assert "not explained" in run["summary"]
    (trace,) = [r for r in run["records"]["gap_row"] if r["label"] == "trace"]
    stages = {s["stage"]: s["max_diff"] for s in trace["trace"]["stages"]}
    assert trace["first_divergence"] == "routing" and stages["router logits"] == 0.0
    assert stages["block on HF's routing"] == 0.0 and stages["block"] > 0


def test_qwen3_next_probe_builds_both_attention_kinds_on_cuda_and_waits_for_the_agent(unpacked: Path) -> None:
    run = snapshots_by_model(unpacked)["type:qwen3_next"]
    assert (run["phase"], run["awaiting"]) == ("probe", "agent")
    assert "linear (linear_attention) x moe" in run["summary"] and "gqa (full_attention) x moe" in run["summary"]
    assert "each built and checked on meta" in run["summary"]
