"""A state dir is self-contained: copied or moved, it still resolves its targets and inputs.

Issue 39, tried as a new user would: the target and the config-file models were recorded as absolute
paths of the machine that ran them, so the README's `git -C "$(orchestrator status RUN --json | ...
["target"])" show --stat HEAD` recipe broke once the state dir was copied, and an input config.json was
recorded by path with no hash. Now a target inside the state dir (every embedded workspace) is recorded
relative to it and read back against the state dir it is read from (`status --json`'s `target` stays
absolute), and every input file an option names is recorded with its sha256 and, when small, kept as an
artifact. Runs recorded before (absolute paths) read and audit as they did.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from orchestrator import engine
from orchestrator.trail.store import RunStore
from tests.conftest import ROOT, cli, make_repo
from tests.reliability_kit import events

RECIPE = ("git -C \"$(python -m orchestrator.cli status {run} --json --state-dir {state} | python -c 'import json,sys; "
          "print(json.load(sys.stdin)[\"target\"])')\" show --stat HEAD")


def readme_recipe(run_id: str, state: Path) -> subprocess.CompletedProcess:
    """The README's recipe, as a person pastes it into a shell (from the project root, so the module runs)."""
    return subprocess.run(["bash", "-c", RECIPE.format(run=run_id, state=state)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def moved_toy_run(tmp_path: Path) -> dict:
    """A toy run whose target lives inside its state dir and that was given a config file; then the state dir
    is moved elsewhere and the config file deleted."""
    state = tmp_path / "state"
    target = state / "workspaces" / "toy"
    make_repo(target, {"a.txt": "hello\n", "allowed/README": "edit here\n"})
    config = tmp_path / "inputs" / "config.json"
    config.parent.mkdir()
    config.write_text('{"hidden_size": 64}\n')
    digest = sha256(config)
    run_id = engine.start("toy", {"target": str(target), "color": "red", "config": str(config)},
                          store=RunStore(state)).run_id
    moved = tmp_path / "elsewhere" / "state"
    moved.parent.mkdir()
    shutil.move(str(state), moved)
    config.unlink()
    return {"run_id": run_id, "state": moved, "sha256": digest}


def test_a_target_inside_the_state_dir_is_recorded_relative_and_resolves_after_a_move(moved_toy_run: dict) -> None:
    run_id, state = moved_toy_run["run_id"], moved_toy_run["state"]
    started = events(state, run_id)[0]["data"]
    assert started["target"] == "workspaces/toy", started["target"]
    status = json.loads(cli("status", run_id, "--json", state_dir=state).stdout)
    assert status["target"] == str(state / "workspaces" / "toy"), status["target"]
    recipe = readme_recipe(run_id, state)
    assert recipe.returncode == 0 and "a.txt" in recipe.stdout, recipe.stdout + recipe.stderr
    (state / "workspaces" / "toy" / "allowed" / "fixed.txt").write_text("done\n")
    assert engine.advance(run_id, store=RunStore(state)).state["status"] == "done"  # the engine works there too
    assert cli("audit", run_id, state_dir=state).returncode == 0


def test_an_input_file_is_recorded_with_its_hash_and_kept_in_the_state_dir(moved_toy_run: dict) -> None:
    run_id, state = moved_toy_run["run_id"], moved_toy_run["state"]
    (config,) = events(state, run_id)[0]["data"]["inputs"]
    assert config["options"] == ["config"] and config["sha256"] == moved_toy_run["sha256"], config
    assert config["path"].endswith("inputs/config.json") and config["artifact"] == "inputs/config/config.json"
    kept = state / "runs" / run_id / "artifacts" / config["artifact"]
    assert sha256(kept) == moved_toy_run["sha256"]
    shown = cli("show", run_id, state_dir=state).stdout
    assert f"config: {config['path']}" in shown and moved_toy_run["sha256"][:16] in shown, shown


def test_old_runs_with_absolute_paths_still_read(tmp_path: Path, toy_repo: Path) -> None:
    """A run whose target lies outside its state dir keeps the absolute path, as every run before did."""
    state = tmp_path / "state"
    run_id = engine.start("toy", {"target": str(toy_repo), "color": "red"}, store=RunStore(state)).run_id
    assert events(state, run_id)[0]["data"]["target"] == str(toy_repo)
    assert json.loads(cli("status", run_id, "--json", state_dir=state).stdout)["target"] == str(toy_repo)


@pytest.fixture(scope="module")
def copied_moe_start(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """`orchestrator start add-moe-model --model config.json` on the embedded target, then the state dir copied
    to another folder and the original (and the config.json) removed: what an auditor is handed."""
    from transformers import Qwen3MoeConfig

    home = tmp_path_factory.mktemp("portable-moe")
    config = home / "model" / "config.json"
    config.parent.mkdir()
    Qwen3MoeConfig(num_hidden_layers=2, num_experts=8).to_json_file(str(config))
    digest = sha256(config)
    started = cli("start", "add-moe-model", "--model", str(config), "--branch", "new", "--commit", "auto", "--json",
                  state_dir=home / "state", timeout=600)
    assert started.returncode == 0, started.stderr
    run_id = json.loads(started.stdout)["run_id"]
    copy = home / "copy" / "state"
    shutil.copytree(home / "state", copy, symlinks=True)
    shutil.rmtree(home / "state")
    shutil.rmtree(config.parent)
    return {"run_id": run_id, "state": copy, "sha256": digest}


def test_the_readme_recipe_works_on_a_copied_add_moe_state_dir(copied_moe_start: dict) -> None:
    run_id, state = copied_moe_start["run_id"], copied_moe_start["state"]
    target = json.loads(cli("status", run_id, "--json", state_dir=state).stdout)["target"]
    assert Path(target).is_relative_to(state) and os.path.isabs(target), target
    recipe = readme_recipe(run_id, state)
    assert recipe.returncode == 0 and "torchtitan" in recipe.stdout, recipe.stdout + recipe.stderr
    (model,) = [i for i in events(state, run_id)[0]["data"]["inputs"] if "model" in i["options"]]
    assert model["sha256"] == copied_moe_start["sha256"] and model["artifact"], model
    assert sha256(state / "runs" / run_id / "artifacts" / model["artifact"]) == copied_moe_start["sha256"]
    assert cli("audit", run_id, state_dir=state).returncode == 0
