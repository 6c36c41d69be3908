"""Phase 4: the torchrun rows' commands, the job script, reading a row's log, and the results hand-back.

Logs read here are the H200 run's (bench/results/2026-11-30-add-moe-gpu), as the trainer wrote them.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.context import render_template
from orchestrator.errors import UsageError
from phases.add_moe_model.parallel_matrix import (
    Row, TrainerPaths, diagnose, matrix, row_from_run, trainer_command, trained_steps,
)
from phases.add_moe_model.parallelism import job_script, take_results
from tests.conftest import ROOT, call_worker
from tests.evidence import unpacked

GPU_RUN = unpacked("2026-11-30-add-moe-gpu") / "runs/add-moe-model-20261130-073756-8676/artifacts"
PATHS = TrainerPaths(hf_config="/r/trainer/hf_config", tokenizer="/r/trainer/tokenizer", dataset="/r/trainer/c4_test",
                     dump="/r/out")
FSDP_CAPABILITY = {"torch": "2.11.0+cu130", "ok": False, "error": "fully_shard() has no dp_mesh_dims parameter"}


def test_matrix_sizes_rows_to_the_visible_gpus() -> None:
    def shape(ngpu: int) -> list[tuple]:
        return [(r.config, r.world_size, r.tp, r.ep) for r in matrix(ngpu)]

    assert shape(0) == shape(2) == [("FSDP-1gpu", 1, 1, 1), ("FSDP", 2, 1, 1), ("FSDP+EP", 2, 1, 2),
                                    ("FSDP+TP+EP", 4, 2, 2)]
    assert shape(8) == [("FSDP-1gpu", 1, 1, 1), ("FSDP", 8, 1, 1), ("FSDP+EP", 8, 1, 4), ("FSDP+TP+EP", 8, 2, 4)]


def test_commands_run_the_trainer_module_not_torchruns_module_flag() -> None:
    rows = {r.config: trainer_command(r, PATHS, python="py") for r in matrix(2)}
    one = rows["FSDP-1gpu"]
    assert one[:6] == ["py", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", "-m"]
    launcher = one.index("phases.add_moe_model.work.trainer_launch")
    assert one[launcher + 1:launcher + 5] == ["--module", "transformers_modeling_backend", "--config",
                                              "transformers_modeling_backend_debugmodel_moe"]
    for command in rows.values():
        flags = dict(zip(command[launcher + 1::2], command[launcher + 2::2]))
        assert flags["--hf_model"] == "/r/trainer/hf_config" and flags["--training.steps"] == "2"
        assert flags["--hf_assets_path"] == "/r/trainer/tokenizer"
        assert flags["--dataloader.dataset_path"] == "/r/trainer/c4_test"
        assert command.index("--module") > launcher, "--module belongs to the trainer, after -m"
    assert "--parallelism.data_parallel_shard_degree" not in one
    assert rows["FSDP+EP"][-4:] == ["--parallelism.data_parallel_shard_degree", "-1",
                                    "--parallelism.expert_parallel_degree", "2"]
    assert rows["FSDP+TP+EP"][-4:] == ["--parallelism.tensor_parallel_degree", "2",
                                       "--parallelism.expert_parallel_degree", "2"]


def test_job_script_is_valid_bash_and_leaves_a_log_and_exit_status_per_row(tmp_path: Path) -> None:
    options = {"model_id": "/home/me/acme/config.json", "model_source": "config", "model_name": "Acme-MoE-16E"}
    ctx = SimpleNamespace(render=partial(render_template, "add_moe_model"), options=options,
                          run_id="add-moe-model-x", target=tmp_path)
    script = job_script(ctx, PATHS, matrix(2), python="/usr/bin/python3")
    path = tmp_path / "sbatch.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    assert "#SBATCH --gpus-per-node=4" in script and "ASSETS=${ASSETS:-/r/trainer}" in script
    assert "matrix for Acme-MoE-16E (run add-moe-model-x)" in script and "config.json" not in script
    assert "orchestrator resume add-moe-model-x --results $RESULTS" in script
    for row in matrix(2):
        assert f'> "$RESULTS/{row.slug}.log" 2>&1' in script and f'"$RESULTS/{row.slug}.rc"' in script
    assert '--hf_model "$ASSETS/hf_config"' in script and "torchrun --module" not in script


def test_rows_read_from_the_h200_logs() -> None:
    log = (GPU_RUN / "parallelism/FSDP-1gpu.log").read_text()
    assert [s["step"] for s in trained_steps(log)] == [1, 2]
    passed = row_from_run(Row(config="FSDP-1gpu", world_size=1), command="c", returncode=0, log=log, log_name="l",
                          fsdp=None)
    assert passed["status"] == "PASS" and passed["torch_compat"][0]["torch"] == "2.11.0+cu130"
    assert len(passed["torch_compat"][0]["applied"]) == 4
    failed_log = (GPU_RUN / "parallelism/FSDP.log").read_text()
    failed = row_from_run(Row(config="FSDP", world_size=2), command="c", returncode=1, log=failed_log,
                          log_name="l", fsdp=FSDP_CAPABILITY)
    assert failed["status"] == "FAIL" and not failed["fixable"]
    assert failed["error"] == "TypeError: fully_shard() got an unexpected keyword argument 'dp_mesh_dims'"
    assert failed["root_cause"].startswith("torch 2.11.0+cu130: fully_shard cannot shard")


def test_exit_zero_without_training_steps_is_not_a_pass() -> None:
    row = row_from_run(Row(config="FSDP-1gpu", world_size=1), command="c", returncode=0, log="done\n",
                       log_name="l", fsdp=None)
    assert row["status"] == "FAIL" and row["fixable"]


def test_diagnosis_names_known_causes_and_leaves_the_rest_to_the_agent() -> None:
    assert diagnose("ModuleNotFoundError: No module named 'transformers_modeling_backend'", None)[0].startswith(
        "command: torchrun's --module is a flag")
    assert diagnose("torch.OutOfMemoryError: CUDA out of memory.", None) == ("GPU memory", False)
    assert diagnose("ValueError: Unsharded modules with no _sharding_config: ['x']", None)[1] is True
    assert diagnose("KeyError: 'weird'", None) == ("undiagnosed: read the log, fix in the experiment folder or "
                                                   "name the cause", True)


def handback_state(pending: bool) -> dict:
    """A run waiting at parallelism with every row unrun here (as the phase leaves it on a machine without GPUs)."""
    rows = [{"config": r.config, "world_size": r.world_size, "tp": r.tp, "ep": r.ep, "command": f"cmd {r.slug}",
             "status": "UNRUN", "error": "needs GPUs", "root_cause": "", "log": None, "ran": False}
            for r in matrix(2)]
    data = {"rows": rows, "build_check": [], "gpus": 0, "fsdp": {"ok": False}, "torch_compat": {"applied": []}}
    return {"workflow": "add-moe-model", "results": {"parallelism": data},
            "pending": [{"key": "unrun_rows"}] if pending else []}


def test_handed_back_logs_become_rows(tmp_path: Path) -> None:
    shutil.copy(GPU_RUN / "parallelism/FSDP-1gpu.log", tmp_path / "FSDP-1gpu.log")
    (tmp_path / "FSDP-1gpu.rc").write_text("0\n")
    shutil.copy(GPU_RUN / "parallelism/FSDP.log", tmp_path / "FSDP.log")
    (tmp_path / "FSDP.rc").write_text("1\n")
    (tmp_path / "FSDP_EP.log").write_text("no exit status next to me\n")
    handed = take_results(handback_state(pending=True), tmp_path)
    rows = {record["config"]: record for kind, record in handed.records}
    assert {kind for kind, _ in handed.records} == {"parallelism_row"} and sorted(rows) == ["FSDP", "FSDP-1gpu"]
    assert rows["FSDP-1gpu"]["status"] == "PASS" and rows["FSDP-1gpu"]["command"] == "cmd FSDP-1gpu"
    assert rows["FSDP"]["status"] == "FAIL" and rows["FSDP"]["root_cause"].startswith("torch: fully_shard cannot shard")
    assert rows["FSDP"]["source"] == f"handed back from {tmp_path}"
    assert sorted(handed.artifacts) == ["parallelism/handed_back/FSDP-1gpu.log", "parallelism/handed_back/FSDP.log"]
    assert handed.answers == {"unrun_rows": "handed-back"}
    assert take_results(handback_state(pending=False), tmp_path).answers == {}


def test_unusable_hand_backs_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no row's log and return code"):
        take_results(handback_state(pending=True), tmp_path)
    (tmp_path / "FSDP.log").write_text("x\n")
    (tmp_path / "FSDP.rc").write_text("killed\n")
    with pytest.raises(UsageError, match="expected the job's exit status"):
        take_results(handback_state(pending=True), tmp_path)
    with pytest.raises(UsageError, match="no rows yet"):
        take_results({"workflow": "add-moe-model", "results": {}, "pending": []}, tmp_path)


@pytest.mark.slow
def test_a_row_command_runs_as_written_up_to_the_gpu(tmp_path: Path) -> None:
    """Locally made assets and the FSDP row's command: the trainer parses every flag; no GPU here stops it."""
    from phases.add_moe_model.work.torch_compat import parse_announcements
    from tests.test_moe_build_check import QWEN3

    if shutil.which("nvidia-smi"):
        pytest.skip("a GPU is visible: the row would train (the H200 run covers that)")
    assets = call_worker("phases.add_moe_model.work.trainer_assets:make_assets",
                         {"model_type": "qwen3_moe", "config_kwargs": QWEN3})
    assert assets["vocab_size"] == 256 and assets["fsdp"]["torch"] == assets["compat"]["torch"]
    for name, text in assets["files"].items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    paths = TrainerPaths(hf_config=str(tmp_path / "hf_config"), tokenizer=str(tmp_path / "tokenizer"),
                         dataset=str(tmp_path / "c4_test"), dump=str(tmp_path / "out"))
    from orchestrator.worker import worker_env

    command = trainer_command(matrix(0)[0], paths, python=sys.executable)
    done = subprocess.run(command, cwd=tmp_path, env=worker_env(ROOT), capture_output=True, text=True, timeout=600)
    log = done.stdout + done.stderr
    row = row_from_run(matrix(0)[0], command="c", returncode=done.returncode, log=log, log_name="l", fsdp=None)
    assert row["status"] == "FAIL" and row["root_cause"] == "no usable GPU in this process", log[-2000:]
    assert [a["applied"] for a in parse_announcements(log)][:1] == ([assets["compat"]["applied"]]
                                                                     if assets["compat"]["applied"] else [])


def test_audit_rule_holds_every_passed_row_to_the_skill() -> None:
    from phases.add_moe_model.rules import parallelism_rows_accounted

    def completed(seq: int, *rows: dict) -> dict:
        return {"seq": seq, "type": "phase_completed", "phase": "parallelism", "actor": "engine",
                "data": {"outcome": "passed", "data": {"rows": list(rows)}}}

    good = [{"config": "FSDP-1gpu", "status": "PASS"}, {"config": "FSDP", "status": "FAIL", "root_cause": "torch"}]
    assert parallelism_rows_accounted([completed(3, *good)], {}) == []
    bad = [{"config": "FSDP", "status": "FAIL", "root_cause": ""}, {"config": "FSDP+EP", "status": "SKIPPED"},
           {"config": "FSDP-1gpu", "status": "UNRUN"}]
    assert parallelism_rows_accounted([completed(4, *bad)], {}) == [
        (4, "FSDP: FAIL without a root cause"), (4, "FSDP+EP: status 'SKIPPED' (skill: PASS or FAIL)"),
        (4, "FSDP-1gpu: UNRUN but no human accepted unrun rows")]
    accept = {"seq": 2, "type": "answer_accepted", "phase": "parallelism", "actor": "human",
              "data": {"key": "unrun_rows", "value": "accept"}}
    assert parallelism_rows_accounted([accept, completed(4, bad[2])], {}) == []


def test_accepting_unrun_rows_up_front_is_a_persons_start_option_only(tmp_path: Path) -> None:
    """``--unrun-rows accept`` answers the parallelism question ahead of time, like --branch/--commit."""
    from orchestrator import engine
    from orchestrator.trail.store import RunStore

    store = RunStore(tmp_path / "state")
    with pytest.raises(UsageError, match="unrun_rows"):
        engine.start("add-moe-model", {"model": "Qwen/Qwen3-30B-A3B", "unrun_rows": "accept"}, store=store,
                     actor="agent")
    assert not (tmp_path / "state").exists()
    with pytest.raises(UsageError, match="--unrun-rows: Input should be 'accept'"):
        engine.start("add-moe-model", {"model": "Qwen/Qwen3-30B-A3B", "unrun_rows": "maybe"}, store=store)


def test_a_build_error_is_named_for_the_code_that_raised_it() -> None:
    """Blind trial (axk2): model.py's update_from_config raised on n_group=None at every world size, and the
    three findings read module_without_sharding_config "unsharded: -" pointing at hf_sharding.py."""
    from phases.add_moe_model.parallelism import build_check_issue

    base = {"world_size": 2, "tp": 1, "ep": 2, "status": "FAIL", "unsharded_modules": []}
    exp = "torchtitan/experiments/transformers_modeling_backend/model.py:513 update_from_config"
    raised = {**base, "error": "TypeError: '>' not supported", "error_origin": "target", "error_frame": exp}
    issue = build_check_issue(raised)
    assert issue.code == "build_check_error" and issue.fix_location.startswith(
        "torchtitan/experiments/transformers_modeling_backend/model.py (")
    core = build_check_issue({**raised, "error_frame": "torchtitan/models/moe/moe.py:90 forward"})
    assert core.code == "raised_in_torchtitan_core" and core.fix_location.startswith("torchtitan/models/moe/moe.py")
    hf = build_check_issue({**raised, "error_origin": "transformers", "error_frame": "transformers/x.py:1 f"})
    assert hf.code == "raised_in_transformers"
    unsharded = build_check_issue({**base, "error": None, "unsharded_modules": ["layers.0.self_attn.g_proj"]})
    assert unsharded.code == "module_without_sharding_config" and "g_proj" in unsharded.message


def test_a_config_of_the_folder_lacking_what_transformers_reads_is_the_agents(tmp_path, monkeypatch) -> None:
    """Blind trial 2 (jamba): JambaModel reads layers_block_type, a property of JambaConfig, from the experiment
    folder's Config, which copies only the HF config's instance fields. The innermost frame is transformers', yet
    the fix is the folder's: the error names the class that lacks the attribute and the agent gets it."""
    import importlib.util
    import sys

    from transformers import JambaConfig
    from transformers.models.jamba.modeling_jamba import JambaModel

    from phases.add_moe_model.parallelism import build_check_issue
    from phases.add_moe_model.work.error_origin import describe_error, error_origin

    folder = tmp_path / "torchtitan/experiments/transformers_modeling_backend"
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(
        "from transformers import PretrainedConfig\n\n\n"
        "class Config(PretrainedConfig):\n"
        "    def update_from_config(self, hf):\n"
        "        vars(self).update({k: v for k, v in vars(hf).items() if k != 'layers_block_type'})\n"
        "        return self\n")
    spec = importlib.util.spec_from_file_location("trial_model", folder / "model.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "trial_model", module)  # imported, as the backend's model.py is
    spec.loader.exec_module(module)
    config = module.Config().update_from_config(JambaConfig(num_hidden_layers=2, hidden_size=64,
                                                            intermediate_size=64, num_attention_heads=4))
    with pytest.raises(AttributeError) as caught:
        JambaModel(config)
    origin, frame = error_origin(caught.value)
    assert origin == "target" and frame.startswith(
        "torchtitan/experiments/transformers_modeling_backend/model.py:4 Config (has no 'layers_block_type')"), frame
    row = {"world_size": 2, "tp": 1, "ep": 2, "error": describe_error(caught.value), "unsharded_modules": [],
           "error_frame": frame, "error_origin": origin}
    issue = build_check_issue(row)
    assert issue.code == "build_check_error" and "model.py" in issue.fix_location
    assert "in the experiment folder" in issue.fix_location
