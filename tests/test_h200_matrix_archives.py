"""The H200 matrix evidence of 2026-12-02 kept as archives (bench/results/2026-12-02-h200-matrix): issue 22's bars.

- ``survey-and-main/all.tgz``: the survey of every MoE type on one H200 (``--jobs 10``) and, in the
  same device call, the 8 upstream models on the main snapshot (bench/h200_matrix.sh PART=all);
- ``readme1-cuda/readme1.tgz``: README command 1 with ``--device cuda``;
- ``survey-tiers/survey.tgz``: the survey again, a later call, with one tier per row and the probe's routing check.
Each archive holds trails, signed heads and the public key, never the private key: every trail
audits here with the public key alone.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

EVIDENCE = ROOT / "bench/results/2026-12-02-h200-matrix"
UPSTREAM_TIERS = {"Qwen/Qwen3-30B-A3B": "PASS", "mistralai/Mixtral-8x7B-v0.1": "WARN",
                  "deepseek-ai/DeepSeek-V3": "WARN", "allenai/OLMoE-1B-7B-0924": "PASS",
                  "deepseek-ai/DeepSeek-V2-Lite": "PASS", "type:glm4_moe": "WARN", "type:glm_moe_dsa": "WARN"}


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("h200-matrix")
    for name, archive in (("all", "survey-and-main/all.tgz"), ("readme1", "readme1-cuda/readme1.tgz"),
                          ("tiers", "survey-tiers/survey.tgz")):
        with tarfile.open(EVIDENCE / archive) as tar:
            assert not [m.name for m in tar.getmembers() if m.name.endswith("trail.ed25519")], "private key shipped"
            tar.extractall(home / name, filter="data")
    return home


def audit_all(invoke, monkeypatch, anchors: Path, state: Path, *, schema: bool = False) -> int:
    """Audit every run under ``state`` (``schema``: record payloads against their declared models too)."""
    monkeypatch.setenv("ORCHESTRATOR_ANCHOR_DIR", str(anchors))
    runs = sorted(p.name for p in (state / "runs").iterdir())
    for run_id in runs:
        result = invoke("audit", run_id, "--state-dir", str(state), "--json", *(["--schema"] if schema else []))
        body = json.loads(result.output)
        assert body["signed_by"].startswith("ed25519 key "), result.output
        assert body["findings"] == [], body["findings"]
    return len(runs)


def test_every_trail_audits_with_the_public_key_alone(unpacked, invoke, monkeypatch):
    counted = [audit_all(invoke, monkeypatch, unpacked / "all" / "anchors", unpacked / "all" / f"{part}-state")
               for part in ("survey", "main")]
    counted.append(audit_all(invoke, monkeypatch, unpacked / "readme1" / "anchors", unpacked / "readme1"))
    counted.append(audit_all(invoke, monkeypatch, unpacked / "tiers" / "anchors", unpacked / "tiers"))
    assert counted == [51, 8, 1, 51]


def test_the_survey_of_every_type_on_one_h200_has_no_error_within_ten_minutes(unpacked):
    body = json.loads((unpacked / "all" / "survey-state" / "survey" / "survey.json").read_text())
    assert len(body["rows"]) == 64 and body["counts"]["error"] == 0, body["counts"]
    assert body["seconds"] <= 600
    numerics = [r["numerics"] for r in body["rows"] if r["numerics"]]
    assert numerics and all(n["kl_fp64"] is not None and n["spread"] is not None for n in numerics)


def test_the_upstream_models_on_main_reach_upstreams_tier_on_cuda(unpacked):
    assert_upstream_tiers_on_cuda(unpacked / "all" / "main-state")


def assert_upstream_tiers_on_cuda(state: Path) -> None:
    for model, tier in UPSTREAM_TIERS.items():
        status = json.loads((state / f"{model.replace('/', '_').replace(':', '_')}.json").read_text())
        run = json.loads((state / "runs" / status["run_id"] / "run.json").read_text())
        verdict = run["results"]["numerics"]["verdict"]
        assert run["status"] == "done" and verdict["status"] == tier and verdict["device"] == "cuda", (model, verdict)
        assert verdict["moe_layout"].startswith("TD") and verdict["firmness"]["kl_fp64"] is not None


def test_readme_command_1_on_cuda_trains_its_one_gpu_row(unpacked):
    assert_one_gpu_row_trained_on_cuda(next((unpacked / "readme1" / "runs").iterdir()))


def assert_one_gpu_row_trained_on_cuda(run_dir: Path) -> None:
    run = json.loads((run_dir / "run.json").read_text())
    rows = {r["config"]: r for r in run["results"]["parallelism"]["rows"]}
    assert run["status"] == "done" and run["results"]["numerics"]["verdict"]["device"] == "cuda"
    assert rows["FSDP-1gpu"]["status"] == "PASS"
    assert all(r["status"] == "FAIL" and "2.14" in r["root_cause"] for c, r in rows.items() if c != "FSDP-1gpu")


def test_the_later_survey_shows_one_tier_per_row_and_routes_phimoe_to_a_person(unpacked):
    body = json.loads((unpacked / "tiers" / "survey" / "survey.json").read_text())
    assert len(body["rows"]) == 64 and body["counts"]["error"] == 0 and body["seconds"] <= 600, body["counts"]
    rows = {r["model_type"]: r for r in body["rows"]}
    shown = [r["numerics"] for r in body["rows"] if r["numerics"]]
    assert shown and all(n["tier_shown"].split(" ")[0] == n["tier"] and "|" not in n["tier_shown"] for n in shown)
    assert all(r["outcome"] != "fail" or r["numerics"]["tier"] == "FAIL" for r in body["rows"])
    phimoe = rows["phimoe"]
    assert phimoe["outcome"] == "needs_human" and "router_rule_unsupported" in phimoe["reasons"][0]
