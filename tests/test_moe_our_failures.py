"""Failures of our own code or process plumbing are errors of ours, never findings for the agent.

Seen on an H200: calls forked after CUDA was initialised died with "Cannot re-initialize CUDA in
forked subprocess" inside the target's state_dict_adapter.py, and the survey blamed the experiment
folder; the firmness block called main's (tokens, dim) MoE with (B, L, D) and its crash was one
line under "All models passed".
"""

from __future__ import annotations

from pathlib import Path

from phases.add_moe_model import numerics
from phases.add_moe_model.survey.outcome import attribute_traceback
from phases.add_moe_model.work.numerics import CompareResult, RoundTrip
from tests.conftest import call_worker
from tests.test_moe_numerics import SYNTHETIC

FORKED_CUDA = ("RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, "
               "you must use the 'spawn' start method")


def _row(**fields) -> CompareResult:
    base = dict(model_type="qwen3_moe", dtype="bfloat16", device="cuda", seed=0, roundtrip=RoundTrip(status="PASS"))
    return CompareResult(**{**base, **fields})


def test_a_fork_that_broke_cuda_in_the_experiments_frame_ends_the_phase_as_ours():
    row = _row(status="ERROR", error=FORKED_CUDA, error_type="RuntimeError", error_origin="target",
               error_frame="torchtitan/experiments/transformers_modeling_backend/state_dict_adapter.py:88 f")
    result = numerics.decide([row])
    assert result.outcome == "failed" and result.issues[0].code == "worker_plumbing_error"
    assert result.issues[0].fix_location.startswith("the orchestrator's worker process")


def test_a_worker_that_died_of_a_broken_fork_is_an_error_row_not_the_agents(tmp_path: Path):
    root = str(tmp_path / "target")
    log = ("Traceback (most recent call last):\n"
           f'  File "{root}/torchtitan/experiments/transformers_modeling_backend/state_dict_adapter.py", line 88, '
           "in hf_to_titan_moe_state_dict\n    t.to(device)\n"
           '  File "/usr/lib/python3/site-packages/torch/cuda/__init__.py", line 300, in _lazy_init\n'
           f"{FORKED_CUDA}\n")
    row = attribute_traceback(log, roots=(root,), summary="numerics failed", log="numerics.log")
    assert row["outcome"] == "error", row


def test_a_firmness_crash_is_an_error_of_ours_not_a_pass():
    row = _row(status="PASS", kl=1e-7, cos_sim=1.0, max_diff=1e-3,
               firmness={"error": "RuntimeError: output with shape [8] doesn't match the broadcast shape [16, 8]"})
    result = numerics.decide([row])
    assert result.outcome == "failed" and [i.code for i in result.issues] == ["firmness_error"]


def test_firmness_on_main_feeds_the_moe_the_token_layout_it_takes(main_snapshot):
    out = call_worker("phases.add_moe_model.work.numerics:compare_dtypes",
                      {"model_type": "qwen3_moe", "config_kwargs": SYNTHETIC["qwen3_moe"], "dtypes": ["bfloat16"],
                       "device": "cpu"}, target=main_snapshot)
    bf16 = out["results"][0]
    assert bf16["moe_layout"].startswith("TD"), bf16["moe_layout"]
    firm = bf16["firmness"]
    assert "error" not in firm and firm["kl_perturbed"] is not None and firm["spread"] is not None, firm


def test_a_module_the_trainer_lacks_is_a_root_cause_naming_it_and_the_targets_pinned_package(main_snapshot):
    from phases.add_moe_model.parallel_matrix import diagnose

    log = "[rank0]:     import grain\n[rank0]: ModuleNotFoundError: No module named 'grain'\n"
    cause, fixable = diagnose(log, None, target=main_snapshot)
    assert cause == ("missing Python module 'grain' in the trainer's environment: pip install 'grain==0.2.18' "
                     "(pinned in the target's pyproject.toml)") and fixable is False
    assert "pip install grain (the package named after" in diagnose(log, None)[0]


def test_the_router_correction_bias_loads_into_titans_expert_bias_on_main(main_snapshot, tmp_path):
    # glm_moe_dsa on main, adapter fixed, noted "unexpected keys ['expert_bias_E']": the worker built
    # the MoE with load_balance_coeff=None, which has no such buffer, and the bias was dropped.
    from tests.conftest import clone_of

    tree = clone_of(main_snapshot, tmp_path / "tt")
    adapter = tree / "torchtitan/experiments/transformers_modeling_backend/state_dict_adapter.py"
    adapter.write_text(adapter.read_text().replace(r'r"\1expert_bias"', r'r"\1expert_bias_E"')
                       .replace(r'r"^(.*\.)expert_bias$"', r'r"^(.*\.)expert_bias_E$"'))
    config = {**SYNTHETIC["deepseek_v3"], "hidden_size": 256, "moe_intermediate_size": 128, "intermediate_size": 512}
    out = call_worker("phases.add_moe_model.work.numerics:compare_dtypes",
                      {"model_type": "deepseek_v3", "config_kwargs": config, "dtypes": ["float32"], "device": "cpu"},
                      target=tree)
    load = out["results"][0]["load"]
    assert load["unexpected"] == [] and "expert_bias_E" not in load["missing"], load
