"""The CUDA matrix of 2026-12-03 (bench/results/2026-12-03-h200-all), run with typed results and records:
every run audits here with the public key alone, record payloads included (--schema); the survey has no error
and finished within ten minutes; README command 1 trained on one GPU; the main snapshot's models have the
upstream tiers; docs/survey-h200.md is the survey's table."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.test_h200_matrix_archives import assert_one_gpu_row_trained_on_cuda, assert_upstream_tiers_on_cuda, audit_all

FOLDER = ROOT / "bench/results/2026-12-03-h200-all"
README_RUN = "add-moe-model-20261203-195405-299d"


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("h200-all")
    with tarfile.open(FOLDER / "all.tgz") as tar:
        assert not [m.name for m in tar.getmembers() if m.name.endswith("trail.ed25519")], "private key shipped"
        tar.extractall(home, filter="data")
    return home


def test_every_run_audits_and_the_survey_has_no_error(unpacked, invoke, monkeypatch):
    body = json.loads((unpacked / "survey-state" / "survey" / "survey.json").read_text())
    assert len(body["rows"]) == 64 and body["counts"]["error"] == 0 and body["seconds"] <= 600, body["counts"]
    assert body["device"] == "cuda"
    audited = [audit_all(invoke, monkeypatch, unpacked / "anchors", unpacked / part, schema=True)
               for part in ("survey-state", "main-state")]
    assert audited == [52, 8]


def test_readme_command_one_trained_on_one_gpu(unpacked):
    assert_one_gpu_row_trained_on_cuda(unpacked / "survey-state" / "runs" / README_RUN)


def test_the_main_snapshots_models_have_the_upstream_tiers(unpacked):
    assert_upstream_tiers_on_cuda(unpacked / "main-state")


def test_the_doc_is_this_surveys_table(unpacked):
    table = (unpacked / "survey-state" / "survey" / "SURVEY.md").read_text().split("\n| Model type |", 1)[1]
    assert table in (ROOT / "docs" / "survey-h200.md").read_text()
