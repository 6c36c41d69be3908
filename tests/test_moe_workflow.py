"""add-moe-model through the real CLI on the embedded torchtitan workspace.

One state dir per test session holds the pristine workspace (made once from the installed
torchtitan 0.3.0); each run clones it. These tests are few and real: each run imports
torchtitan in worker subprocesses (~15 s per phase on 2 cores).
"""

from __future__ import annotations

import json
from pathlib import Path

import git
import pytest

from tests.conftest import cli
from tests.run_fixtures import run_json

EXP = "torchtitan/experiments/transformers_modeling_backend/"
pytestmark = pytest.mark.slow


def events(state_dir: Path, run_id: str) -> list[dict]:
    lines = (state_dir / "runs" / run_id / "events.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_rows_this_machine_cannot_run_wait_for_a_human_and_stay_unrun(qwen_run, moe_state):
    """No GPU here: the 1-GPU FSDP row is UNRUN (never PASS, never dropped) until a human accepts or hands back."""
    waiting = qwen_run["waiting"]
    if waiting["phase"] != "parallelism":
        pytest.skip("GPUs are visible: every row ran")
    assert waiting["awaiting"] == "human" and "sbatch.sh" in waiting["pending"][0]["prompt"]
    artifacts = moe_state / "runs" / waiting["run_id"] / "artifacts"
    rows = {r["config"]: r for r in json.loads((artifacts / "parallelism.json").read_text())["rows"]}
    assert rows["FSDP-1gpu"]["status"] == "UNRUN" and rows["FSDP-1gpu"]["error"].startswith("needs 1 GPU(s)")
    for config in ("FSDP", "FSDP+EP", "FSDP+TP+EP"):
        assert rows[config]["status"] in ("UNRUN", "FAIL") and not rows[config]["ran"], rows[config]
    assert (artifacts / "parallelism" / "sbatch.sh").read_text().startswith("#!/bin/bash")
    feedback = [e["data"]["text"] for e in events(moe_state, waiting["run_id"])
                if e["type"] == "note_added" and e["data"]["kind"] == "skill_feedback"]
    assert any("torchrun's --module is its own flag" in text for text in feedback)


def test_accepting_the_unrun_rows_runs_nothing_again(qwen_run, moe_state):
    """The answer settles the question asked: the build check and the trainer assets ran once, not twice."""
    if qwen_run["waiting"]["phase"] != "parallelism":
        pytest.skip("GPUs are visible: every row ran")
    trail = events(moe_state, qwen_run["status"]["run_id"])
    workers = [e["data"]["label"] for e in trail if e["type"] == "worker_finished" and e["phase"] == "parallelism"]
    assert workers == ["sharding build check", "trainer assets"]
    completed = [e["data"] for e in trail if e["type"] == "phase_completed" and e["phase"] == "parallelism"]
    assert [c["outcome"] for c in completed] == ["needs_human", "passed"]
    assert completed[0]["data"]["rows"] == completed[1]["data"]["rows"]


def test_qwen3_runs_to_a_commit_inside_the_experiment_folder(qwen_run, moe_state):
    assert qwen_run["code"] == 0, qwen_run["status"]
    status = qwen_run["status"]
    assert status["status"] == "done" and status["phase"] == "done"
    repo = git.Repo(status["target"])
    assert repo.active_branch.name == "add-moe/qwen3-30b-a3b"
    files = list(repo.head.commit.stats.files)
    assert files and all(f.startswith(EXP) for f in files), files
    message = repo.head.commit.message
    assert message.startswith("Add Qwen3-30B-A3B to transformers MoE backend")
    assert ": H=2048, I=768, E=8, top-2, 1 layer\n" in message  # the synthetic entry, beside the real model's
    assert cli("audit", status["run_id"], state_dir=moe_state).returncode == 0
    trail = events(moe_state, status["run_id"])
    probe = next(e for e in trail if e["type"] == "phase_completed" and e["phase"] == "probe")
    real = probe["data"]["data"]
    assert (f"- real model (Qwen/Qwen3-30B-A3B's published config, bundled registry; probe, seq {probe['seq']}): "
            f"H={real['hidden_size']}, I={real['moe_intermediate_size']}, E={real['num_experts']}, "
            f"top-{real['top_k']}, {real['num_hidden_layers']} layers\n") in message, message
    assert trail[-1]["type"] == "run_finished"


def test_gap_analysis_runs_exactly_when_numerics_is_not_pass(qwen_run, moe_state):
    status = qwen_run["status"]
    trail = events(moe_state, status["run_id"])
    verdict = next(e for e in trail if e["type"] == "phase_completed" and e["phase"] == "numerics")
    ran_gap = any(e["phase"] == "gap_analysis" for e in trail)
    decided = verdict["data"]["data"]["verdict"]
    # The safe side: a PASS whose one-ulp spread crosses 1e-6 ("PASS|WARN") runs gap analysis too.
    assert ran_gap == (decided["status"] != "PASS" or bool(decided["firmness"]["edge"]))
    if not ran_gap:
        return
    applied = [e["data"] for e in trail if e["type"] == "patch_applied"]
    reverted = [e["data"] for e in trail if e["type"] == "patch_reverted"]
    assert applied and {pid for r in reverted for pid in r["patch_ids"]} == {a["patch_id"] for a in applied}
    repo = git.Repo(status["target"])
    base = trail[0]["data"]["base"]["commit"]
    for path, blob in reverted[-1]["files"].items():
        assert not path.startswith(EXP) and blob == repo.git.rev_parse(f"{base}:{path}")
    table = (moe_state / "runs" / status["run_id"] / "artifacts" / "gap_table.md").read_text()
    assert table.startswith("| Patch | max_diff | KL | Description |") and "| baseline |" in table
    rows = [e["data"]["record"] for e in trail if e["type"] == "record_added" and e["data"]["kind"] == "gap_row"]
    for row in rows:
        if row["log"]:
            assert (moe_state / "runs" / status["run_id"] / "artifacts" / row["log"]).is_file(), row
    # On CPU too the gap closes: max_diff 0.00 by a measured patch, never a residual "accepted without a trace".
    assert rows[-1]["max_diff"] == 0.0 and rows[-1]["patch_id"], rows[-1]
    assert "| final | 0.00e+00 |" in table and "accepted" not in table


def test_compat_doc_values_come_from_the_trail(qwen_run, moe_state):
    status = qwen_run["status"]
    run_dir = moe_state / "runs" / status["run_id"]
    numerics = json.loads((run_dir / "artifacts" / "numerics.json").read_text())
    verdict = next(r for r in numerics if r["dtype"] == "bfloat16")
    doc = (Path(status["target"]) / EXP / "MODEL_COMPATIBILITY.md").read_text()
    row = next(line for line in doc.splitlines() if line.startswith("| Qwen3-30B-A3B | qwen3_moe |"))
    assert f"{verdict['kl']:.2e}" in row and f"{verdict['max_diff']:.2e}" in row
    assert f"{verdict['cos_sim']:.6f}" in row and row.count("|") == 8


def test_sigmoid_router_model_waits_for_the_agent_with_the_bias_key_issue(moe_state):
    code, status = run_json("run", "add-moe-model", "--model", "deepseek-ai/DeepSeek-V3", "--branch", "current",
                            "--commit", "never", state_dir=moe_state)
    assert code == 4, status
    assert status["phase"] == "probe" and status["awaiting"] == "agent"
    codes = {i["code"] for i in status["issues"]}
    assert "router_bias_key_misnamed" in codes, codes
    assert all(i["fix_location"] for i in status["issues"])


@pytest.mark.parametrize("model, expected", [
    ("some-org/NotARealModel-7B", "offline"),
    ("type:llama", "no MoE layers"),
])
def test_bad_models_exit_2_without_a_run_directory(moe_state, tmp_path, model, expected):
    state = tmp_path / "state"
    result = cli("start", "add-moe-model", "--model", model, "--branch", "current", "--commit", "never",
                 state_dir=state, timeout=600)
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr and "Traceback" not in result.stderr
    assert not list((state / "runs").glob("*")) if (state / "runs").exists() else True
    assert not [p for p in (state / "workspaces").glob("torchtitan-*")] if (state / "workspaces").exists() else True


def test_bad_targets_exit_2(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    result = cli("start", "add-moe-model", "--model", "Qwen/Qwen3-30B-A3B", "--target", str(plain),
                 state_dir=tmp_path / "s")
    assert result.returncode == 2 and "not a git checkout" in result.stderr
    repo = git.Repo.init(tmp_path / "notitan")
    (tmp_path / "notitan" / "x.py").write_text("x = 1\n")
    repo.git.add(A=True)
    repo.index.commit("x")
    result = cli("start", "add-moe-model", "--model", "Qwen/Qwen3-30B-A3B", "--target", str(tmp_path / "notitan"),
                 state_dir=tmp_path / "s")
    assert result.returncode == 2 and "transformers modeling backend" in result.stderr


def test_dirty_target_is_refused(qwen_run, tmp_path):
    target = Path(qwen_run["status"]["target"])
    (target / "stray.txt").write_text("uncommitted\n")
    try:
        result = cli("start", "add-moe-model", "--model", "Qwen/Qwen3-30B-A3B", "--target", str(target),
                     state_dir=tmp_path / "s")
        assert result.returncode == 2 and "uncommitted changes" in result.stderr
    finally:
        (target / "stray.txt").unlink()


def test_target_whose_torchtitan_does_not_import_is_refused_with_the_error(qwen_run, tmp_path):
    clone = git.Repo.clone_from(qwen_run["status"]["target"], tmp_path / "broken")
    module = Path(clone.working_tree_dir) / EXP / "moe_replacement.py"
    module.write_text("raise ImportError('needs DataParallelMeshDims from a newer torch')\n" + module.read_text())
    clone.git.commit("-am", "simulate a torch too old for this torchtitan")
    result = cli("start", "add-moe-model", "--model", "Qwen/Qwen3-30B-A3B", "--target", clone.working_tree_dir,
                 state_dir=tmp_path / "s", timeout=600)
    assert result.returncode == 2, result.stderr
    assert "DataParallelMeshDims" in result.stderr and "with torch 2." in result.stderr
    assert not (tmp_path / "s" / "runs").exists() or not list((tmp_path / "s" / "runs").iterdir())
