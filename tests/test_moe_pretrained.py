"""--weights DIR: the skill's pretrained test (Phase 3b) on a local checkpoint, beside the synthetic one.

Nothing is downloaded: the checkpoint is a tiny qwen3_moe written by transformers' save_pretrained
(``tiny_checkpoint`` in conftest). The end-to-end run on torchtitan main is in test_moe_main_tree.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from orchestrator.errors import UsageError
from orchestrator.phase_api import PhaseResult
from phases.add_moe_model import compat_doc, pretrained, rules, tree_scripts
from phases.add_moe_model.records import Results
from phases.add_moe_model.weights import check_model_type, read_weights_dir
from tests.conftest import call_worker, cli


def test_a_checkpoint_dir_is_read_without_torch(tiny_checkpoint):
    weights = read_weights_dir(str(tiny_checkpoint))
    assert weights.path == str(tiny_checkpoint.resolve()) and weights.model_type == "qwen3_moe"
    assert weights.safetensors == ["model.safetensors"] and weights.tensors > 0
    check_model_type(weights, "qwen3_moe")


def _broken_copies(source: Path, root: Path) -> dict[str, Path]:
    cases = {name: root / name for name in ("no_config", "bad_json", "no_safetensors", "bad_safetensors")}
    for folder in cases.values():
        shutil.copytree(source, folder)
    (cases["no_config"] / "config.json").unlink()
    (cases["bad_json"] / "config.json").write_text("{not json")
    (cases["no_safetensors"] / "model.safetensors").unlink()
    (cases["bad_safetensors"] / "model.safetensors").write_bytes(b"\xff" * 16)
    cases["a_file"] = source / "config.json"
    cases["missing"] = root / "nowhere"
    return cases


def test_a_missing_unreadable_or_incomplete_dir_is_one_clear_line(tiny_checkpoint, tmp_path):
    expected = {"no_config": "no config.json", "bad_json": "config.json is not", "no_safetensors": "no *.safetensors",
                "bad_safetensors": "model.safetensors is not a readable safetensors file",
                "a_file": "not a directory", "missing": "no such directory"}
    for name, folder in _broken_copies(tiny_checkpoint, tmp_path).items():
        with pytest.raises(UsageError) as caught:
            read_weights_dir(str(folder))
        assert expected[name] in str(caught.value) and "\n" not in str(caught.value), (name, str(caught.value))
    with pytest.raises(UsageError, match=r"model_type qwen3_moe.*mixtral"):
        check_model_type(read_weights_dir(str(tiny_checkpoint)), "mixtral")


def test_start_refuses_bad_weights_with_exit_2_and_writes_nothing(tiny_checkpoint, tmp_path):
    state = tmp_path / "state"
    for model, weights, said in (("Qwen/Qwen3-30B-A3B", str(tmp_path / "nowhere"), "no such directory"),
                                 ("mistralai/Mixtral-8x7B-v0.1", str(tiny_checkpoint), "model_type qwen3_moe")):
        done = cli("start", "add-moe-model", "--model", model, "--weights", weights, "--branch", "new",
                   "--commit", "never", state_dir=state)
        assert done.returncode == 2 and said in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (state / "runs").exists() or not any((state / "runs").iterdir())
    assert not (state / "workspaces").exists() or not any((state / "workspaces").iterdir())


@pytest.mark.slow
def test_the_worker_compares_the_checkpoints_first_moe_block_at_the_skills_threshold(tiny_checkpoint,
                                                                                       embedded_workspace):
    answer = call_worker("phases.add_moe_model.work.pretrained:compare_pretrained",
                         {"weights": str(tiny_checkpoint), "device": "cpu", "seed": 42}, target=embedded_workspace)
    assert answer["model"] == "tiny-qwen3-moe" and answer["model_type"] == "qwen3_moe"
    assert (answer["hidden_size"], answer["num_experts"], answer["layer_index"]) == (64, 4, 0)
    assert answer["status"] == ("PASS" if answer["kl"] < 1e-3 else "FAIL"), answer
    assert 0 <= answer["kl"] and -1 <= answer["cos_sim"] <= 1 and answer["max_diff"] >= answer["mean_diff"] >= 0
    assert answer["load"]["unexpected"] == [] and answer["dtype"] == "bfloat16"


def _numerics_event(row: dict) -> dict:
    data = {"verdict": {"dtype": "bfloat16", "status": "PASS", "kl": 1e-7}, "pretrained": row}
    return {"seq": 7, "type": "phase_completed", "phase": "numerics", "data": {"data": data}}


def test_audit_checks_the_pretrained_tier_against_its_kl():
    fine = [_numerics_event({"model": "ck", "status": "PASS", "kl": 5e-4}),
            _numerics_event({"model": "ck", "status": "FAIL", "kl": 2e-3})]
    assert rules.numerics_tier_matches_kl(fine, {}) == []
    wrong = rules.numerics_tier_matches_kl([_numerics_event({"model": "ck", "status": "PASS", "kl": 2e-3})], {})
    assert wrong == [(7, "pretrained ck: status PASS but KL 2.00e-03 is FAIL (skill 3b: PASS below 1e-3)")]


def _row(status: str, kl: float | None, **extra) -> dict:
    return {"model": "ck", "weights": "/w/ck", "model_type": "qwen3_moe", "status": status, "kl": kl, "cos_sim": 0.99,
            "max_diff": 0.1,
            "mean_diff": 0.01, "seed": 42, "error": extra.pop("error", None), **extra}


def test_a_pretrained_fail_makes_gap_analysis_mandatory_and_an_error_goes_to_the_agent():
    passed = PhaseResult(outcome="passed", summary="PASS qwen3_moe", data={"verdict": {}}, route="pass")
    assert pretrained.merge(passed, _row("PASS", 4e-7)).route == "pass"
    failed = pretrained.merge(passed, _row("FAIL", 2e-3))
    assert failed.route == "gap" and failed.outcome == "passed" and "pretrained FAIL" in failed.summary
    assert failed.data["pretrained"]["kl"] == 2e-3
    error = pretrained.merge(passed, _row("ERROR", None, error="KeyError: 'experts.gate_up_proj'",
                                          error_type="KeyError", error_origin="target"))
    assert error.outcome == "needs_agent" and error.issues[0].code == "pretrained_numerics_error"
    ours = pretrained.merge(passed, _row("ERROR", None, error="UnknownMoeLayout: MoE.forward(self, h)",
                                         error_type="UnknownMoeLayout", error_origin="orchestrator"))
    assert ours.outcome == "failed" and ours.issues[0].code == "pretrained_unknown_moe_layout"


def test_the_trees_pretrained_script_output_is_parsed_by_the_checkpoint_name():
    output = ("\nPretrained MoE numerical equivalence (device=cpu, seed=42)\n" + "=" * 80 + "\n"
              "  Loading tiny-qwen3-moe ...\n  Using MoE layer 0\n"
              "  PASS   tiny-qwen3-moe                  KL=3.10e-07  cos=0.999990  max_diff=1.95e-03\n"
              + "=" * 80 + "\nAll models passed.\n")
    answer = {"argv": ["python", "nep.py"], "returncode": 0, "output": output, "moe_inputs": []}
    verdict = tree_scripts.build_verdict(answer, model_type="tiny-qwen3-moe", our_layout="TD: x")
    assert (verdict.status, verdict.kl, verdict.max_diff, verdict.finding) == ("PASS", 3.1e-07, 1.95e-03, None)


def test_the_compat_doc_section_shows_the_pretrained_result():
    from orchestrator.context import render_template
    from phases.add_moe_model.cited import Cited

    results = {"probe": {"model_type": "qwen3_moe", "issues": [], "score_func": "softmax", "top_k": 2,
                         "num_experts": 8, "route_norm": True, "hidden_size": 2048, "moe_intermediate_size": 768,
                         "shared_experts": "none", "attention": "gqa", "moe_mechanism": "decoder_sparse_step",
                         "min_layers_needed": 1},
               "numerics": {"verdict": {"status": "PASS", "kl": 5e-7, "max_diff": 2e-3, "cos_sim": 0.999996,
                                        "roundtrip": {"status": "PASS"}},
                            "pretrained": _row("PASS", 3.1e-7, hidden_size=64)}}
    def render(template, **values):
        return render_template("add_moe_model", template, **values)

    options, cited = {"model_id": "Qwen/Qwen3-30B-A3B"}, Cited(run_id="r")
    values = compat_doc.collect_values(Results.model_validate(results), options=options, cited=cited)
    text = compat_doc.update_doc(render("compat_doc_skeleton.md.j2"), values, render=render)
    assert "- Pretrained weights (ck, hidden 64): PASS KL=3.10e-07 cos=0.990000 max_diff=1.00e-01" in text
    without = compat_doc.collect_values(
        Results.model_validate({**results, "numerics": {"verdict": results["numerics"]["verdict"]}}),
        options=options, cited=cited)
    text = compat_doc.update_doc(render("compat_doc_skeleton.md.j2"), without, render=render)
    assert "- Pretrained weights: not run (no --weights)" in text
    assert json.dumps(values["pretrained"])
