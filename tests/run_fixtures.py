"""The real runs shared across test modules (a pytest plugin, see conftest.py): each is made once per session.

- ``qwen_run``: ``orchestrator run`` of Qwen3 on the embedded target (CPU);
- ``main_qwen_run``: the same on a clone of torchtitan main, with ``--weights``;
- ``embedded_survey`` / ``main_survey``: ``orchestrator survey add-moe-model`` on each tree.
The entry-point x target matrix (tests/test_matrix_cpu.py) checks all four the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import cli, clone_of

EMBEDDED_SURVEY_MODELS = "qwen3_moe,youtu,qwen3_vl_moe_text,jamba,olmoe,mixtral"
MAIN_SURVEY_MODELS = "qwen3_moe,olmoe,mixtral"


def run_json(*args: str, state_dir: Path, timeout: float = 900) -> tuple[int, dict]:
    result = cli(*args, "--json", state_dir=state_dir, timeout=timeout)
    assert result.stdout.strip(), result.stderr
    return result.returncode, json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def moe_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("moe-state")


@pytest.fixture(scope="session")
def qwen_run(moe_state: Path) -> dict:
    code, status = run_json("run", "add-moe-model", "--model", "Qwen/Qwen3-30B-A3B", "--branch", "new",
                            "--commit", "auto", state_dir=moe_state)
    waiting = status
    if code == 3 and [q["key"] for q in status["pending"]] == ["unrun_rows"]:
        code, status = run_json("resume", status["run_id"], "--answer", "unrun_rows=accept", state_dir=moe_state)
    return {"code": code, "status": status, "waiting": waiting, "state": moe_state}


@pytest.fixture(scope="session")
def main_qwen_run(main_snapshot, tiny_checkpoint, tmp_path_factory) -> dict:
    """One real run of the workflow on a clone of main (CPU) with --weights."""
    home = tmp_path_factory.mktemp("main-run")
    target = clone_of(main_snapshot, home / "tt")
    state = home / "state"
    done = cli("run", "add-moe-model", "--model", "Qwen/Qwen3-30B-A3B", "--target", str(target), "--branch", "new",
               "--commit", "auto", "--device", "cpu", "--weights", str(tiny_checkpoint), "--json", state_dir=state,
               timeout=1500)
    status = json.loads(done.stdout.strip().splitlines()[-1])
    if done.returncode == 3 and status["phase"] == "parallelism":  # no GPU here: a human accepts the unrun rows
        done = cli("resume", status["run_id"], "--answer", "unrun_rows=accept", "--json", state_dir=state,
                   timeout=1500)
        status = json.loads(done.stdout.strip().splitlines()[-1])
    trail = [json.loads(line) for line in (state / "runs" / status["run_id"] / "events.jsonl").read_text().splitlines()]
    return {"code": done.returncode, "status": status, "trail": trail, "state": state, "target": target,
            "stderr": done.stderr}


def survey_of(models: str, home: Path, *extra: str) -> dict:
    result = cli("survey", "add-moe-model", "--models", models, "--device", "cpu", "--out", str(home / "out"),
                 "--json", *extra, state_dir=home / "state", timeout=2400)
    body = json.loads(result.stdout) if result.stdout.strip() else {}
    return {"code": result.returncode, "body": body, "home": home, "state": home / "state", "stderr": result.stderr}


@pytest.fixture(scope="session")
def embedded_survey(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One clean type, two refused for a reason, an attention-free hybrid that once crashed our probe, and
    two more upstream types (one of them WARN with gap analysis)."""
    return survey_of(EMBEDDED_SURVEY_MODELS, tmp_path_factory.mktemp("survey"))


@pytest.fixture(scope="session")
def main_survey(main_snapshot, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Three upstream types on torchtitan main, two local tasks side by side (``--jobs 2``)."""
    return survey_of(MAIN_SURVEY_MODELS, tmp_path_factory.mktemp("main-survey"), "--target", str(main_snapshot),
                     "--jobs", "2")
