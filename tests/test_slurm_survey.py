"""``survey add-moe-model --executor slurm``: the model types as one real job array, collected by the same command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import cli
from tests.slurm_kit import Cluster, sbatch_that_kills_its_caller, squeue_named

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


def test_kill_9_between_sbatch_and_record_then_the_same_command_finds_the_array_instead_of_resubmitting(
        slurm_cluster, tmp_path):
    shim = sbatch_that_kills_its_caller(tmp_path / "bin")
    command = ["survey", "add-moe-model", "--models", "youtu,jamba", "--device", "cpu", "--executor", "slurm",
               "--tasks", "2", "--slurm-sbatch-args", "--hold", "--out", str(tmp_path / "out")]
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}"}
    killed = subprocess.run([sys.executable, "-m", "orchestrator.cli", *command, "--state-dir",
                             str(tmp_path / "state")], capture_output=True, text=True, env=env, timeout=300)
    assert killed.returncode == -9, killed.stderr
    intent = json.loads((tmp_path / "out" / "array.json").read_text())
    assert intent["job_id"] == "" and len(squeue_named(intent["key"])) == 1, "one (held) array under the key"
    again = cli(*command, state_dir=tmp_path / "state")
    assert again.returncode == 5, again.stderr
    recovered = json.loads((tmp_path / "out" / "array.json").read_text())
    held = squeue_named(intent["key"])
    subprocess.run(["scancel", recovered["job_id"]], check=True)
    assert recovered["key"] == intent["key"] and len(held) == 1 and held[0].startswith(recovered["job_id"] + "_["), held
