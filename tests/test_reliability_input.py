"""Reliability: bad input through the real CLI: one line on stderr (a JSON error under --json), exit 2,
no traceback, and nothing written (not the state dir, not a run, not an anchor)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from orchestrator import engine
from orchestrator.trail.store import RunStore
from tests.conftest import TOY, make_repo
from tests.reliability_kit import json_error, one_line_error, run_bytes, tree_listing

LONG = "x" * 300
EXP = "torchtitan/experiments/transformers_modeling_backend"
PATCHY = "patchy=tests.toyflow.patchflow:WORKFLOW"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A state dir with a toy run waiting for its human-only color, a patchy run, and files to feed in."""
    root = tmp_path_factory.mktemp("input")
    toy_target, moe_target, patch_target = root / "toy", root / "moe", root / "patchy"
    make_repo(toy_target, {"a.txt": "hello\n", "allowed/README": "edit here\n"})
    make_repo(moe_target, {f"{EXP}/__init__.py": ""})
    make_repo(patch_target, {"core/value.txt": "broken\n", "exp/README": "x\n"})
    os.environ["ORCHESTRATOR_WORKFLOWS"] = f"{TOY},{PATCHY}"
    try:
        store = RunStore(root / "state")
        waiting = engine.start("toy", {"target": str(toy_target)}, store=store).run_id
        engine.advance(waiting, store=store)
        patchy = engine.start("patchy", {"target": str(patch_target)}, store=store).run_id
    finally:
        os.environ["ORCHESTRATOR_WORKFLOWS"] = TOY
    (root / "latin1.diff").write_bytes(b"--- a/core/value.txt\n+++ b/core/value.txt\n@@ -1 +1 @@\n-broken\n+caf\xe9\n")
    return {"root": root, "state": root / "state", "toy": toy_target, "moe": moe_target, "waiting": waiting,
            "patchy": patchy, "fresh": root / "fresh-state"}


def cases(w: dict[str, Any]) -> dict[str, list[bytes | str]]:
    state, fresh, run = str(w["state"]), str(w["fresh"]), w["waiting"]
    return {
        "status of a run id longer than a file name": ["status", LONG, "--state-dir", state],
        "advance of a run id longer than a file name": ["advance", LONG, "--state-dir", state],
        "audit of a run id with a slash": ["audit", "../../etc", "--state-dir", state],
        "status of a non-UTF-8 run id": ["status", b"run-\xff", "--state-dir", state],
        "start with a target name longer than a file name": ["start", "toy", "--target", f"/tmp/{LONG}",
                                                             "--state-dir", fresh],
        "start add-moe with --model longer than a file name": ["start", "add-moe-model", "--model", LONG,
                                                               "--state-dir", fresh],
        "start with a non-UTF-8 option value": ["start", "toy", "--target", b"/tmp/\xff", "--state-dir", fresh],
        "start with --python /nonexistent": ["start", "add-moe-model", "--model", "type:qwen3_moe", "--target",
                                             str(w["moe"]), "--python", "/nonexistent", "--state-dir", fresh],
        "start an unknown workflow": ["start", "nope", "--state-dir", fresh],
        "start with a bad option type": ["start", "toy", "--target", str(w["toy"]), "--sleep", "soon",
                                         "--state-dir", fresh],
        "start toward a target that is not a checkout": ["start", "toy", "--target", "/nonexistent",
                                                         "--state-dir", fresh],
        "start with the state dir on a file": ["start", "toy", "--target", str(w["toy"]), "--state-dir",
                                               str(w["root"] / "latin1.diff")],
        "a non-UTF-8 answer": ["resume", run, "--answer", b"color=\xff", "--state-dir", state],
        "mixed good and bad answers": ["resume", run, "--answer", "color=red", "--answer", "nope=1",
                                       "--state-dir", state],
        "an answer outside the choices": ["resume", run, "--answer", "color=purple", "--state-dir", state],
        "an answer without '='": ["resume", run, "--answer", "color", "--state-dir", state],
        "abort with an empty reason": ["abort", run, "--reason", " ", "--state-dir", state],
        "a non-UTF-8 patch file": ["patch", w["patchy"], "--file", str(w["root"] / "latin1.diff"), "--label", "x",
                                   "--state-dir", state],
        "a missing patch file": ["patch", w["patchy"], "--file", "/nonexistent.diff", "--label", "x",
                                 "--state-dir", state],
        "a missing argument": ["advance", "--state-dir", state],
        "an unknown command": ["frobnicate", "--state-dir", state],
        "an unknown option": ["status", "--colour", "--state-dir", state],
        "a bad --max-phases": ["advance", run, "--max-phases", "0", "--state-dir", state],
    }


WORKFLOW_ENVS = {"an entry naming a missing module": "bad=no.such.module:WORKFLOW",
                 "an entry without '='": "garbage", "an entry naming a missing attribute": "bad=tests.toyflow:NOPE"}
NAMES = list(cases({"state": "", "fresh": "", "waiting": "", "toy": "", "moe": "", "root": Path("/"),
                    "patchy": ""}))


def snapshot_of(w: dict[str, Any]) -> list[list[str]]:
    anchors = Path(os.environ["ORCHESTRATOR_ANCHOR_DIR"])
    return [tree_listing(w["state"]), tree_listing(w["fresh"]), tree_listing(anchors)]


def environment() -> dict[str, str]:
    return {**os.environ, "ORCHESTRATOR_WORKFLOWS": f"{TOY},{PATCHY}"}


@pytest.mark.parametrize("name", NAMES)
def test_bad_input_is_one_line_and_writes_nothing(world: dict[str, Any], name: str) -> None:
    args = cases(world)[name]
    before = snapshot_of(world)
    plain = run_bytes(*args, env=environment())
    assert one_line_error(plain), (plain.returncode, plain.stderr.decode("utf-8", "replace")[-800:])
    as_json = run_bytes(*args, "--json", env=environment())
    assert json_error(as_json), (as_json.returncode, as_json.stdout[-400:], as_json.stderr[-400:])
    assert snapshot_of(world) == before


@pytest.mark.parametrize("name", list(WORKFLOW_ENVS))
def test_broken_workflow_entry_is_one_line(world: dict[str, Any], name: str) -> None:
    env = {**os.environ, "ORCHESTRATOR_WORKFLOWS": WORKFLOW_ENVS[name]}
    workflow = WORKFLOW_ENVS[name].partition("=")[0]
    before = snapshot_of(world)
    proc = run_bytes("start", workflow, "--target", str(world["toy"]), "--state-dir", str(world["fresh"]), env=env)
    assert one_line_error(proc), proc.stderr.decode()
    assert snapshot_of(world) == before
