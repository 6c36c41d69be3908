"""The H200 survey of 2026-12-03 (bench/results/2026-12-03-h200-survey): every row a run that audits here with
the public key alone, no error, within ten minutes; docs/survey-h200.md is its table."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.test_h200_matrix_archives import audit_all

ARCHIVE = ROOT / "bench/results/2026-12-03-h200-survey/survey.tgz"


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("h200-survey")
    with tarfile.open(ARCHIVE) as tar:
        assert not [m.name for m in tar.getmembers() if m.name.endswith("trail.ed25519")], "private key shipped"
        tar.extractall(home, filter="data")
    return home


def test_every_row_is_an_audited_run_and_none_ended_in_error(unpacked, invoke, monkeypatch):
    body = json.loads((unpacked / "survey" / "survey.json").read_text())
    assert len(body["rows"]) == 64 and body["counts"]["error"] == 0 and body["seconds"] <= 600, body["counts"]
    assert body["device"] == "cuda"
    assert audit_all(invoke, monkeypatch, unpacked / "anchors", unpacked) == 51


def test_the_doc_is_this_surveys_table(unpacked):
    table = (unpacked / "survey" / "SURVEY.md").read_text().split("\n| Model type |", 1)[1]
    assert table in (ROOT / "docs" / "survey-h200.md").read_text()
