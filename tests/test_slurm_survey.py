"""``survey add-moe-model --executor slurm``: the model types as one real job array, collected by the same command."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import cli
from tests.slurm_kit import Cluster, slurm_cluster, squeue_named  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow
MODELS = "youtu,jamba"


def survey(home: Path) -> object:
    return cli("survey", "add-moe-model", "--models", MODELS, "--device", "cpu", "--executor", "slurm",
               "--tasks", "2", "--out", str(home / "out"), "--json", state_dir=home / "state", timeout=300)


def test_the_survey_runs_as_one_job_array_and_the_same_command_collects_it(slurm_cluster, tmp_path):
    first = survey(tmp_path)
    assert first.returncode == 5, first.stderr
    assert "waiting (job)" in json.loads(first.stdout)["waiting"]
    array = json.loads((tmp_path / "out" / "array.json").read_text())
    assert array["chunks"] == [["youtu"], ["jamba"]] and array["job_id"]
    assert len(squeue_named(array["key"])) >= 1
    deadline = time.monotonic() + 400
    while True:
        again = survey(tmp_path)
        if again.returncode != 5 or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads((tmp_path / "out" / "array.json").read_text())["job_id"] == array["job_id"], "submitted once"
    rows = {r["model_type"]: r for r in json.loads(again.stdout)["rows"]}
    assert rows["youtu"]["outcome"] == "unsupported" and rows["jamba"]["outcome"] not in ("error", "unsupported")
    audited = cli("audit", rows["jamba"]["run_id"], "--no-anchor", state_dir=tmp_path / "state")
    assert audited.returncode == 0, audited.stdout + audited.stderr
    assert (tmp_path / "out" / "SURVEY.md").is_file()
