"""add-moe-model on torchtitan main (the snapshot in ../shared/targets), where the skill lives.

The three things a new user met there (issue 13), each kept as a test: the frozen guard fired
on an untouched tree, the numerics worker fed main's x_TD MoE the 0.3.0 layout and blamed the
expert weights, and the tree's own numerical_equivalence.py fails on its tree. One real run of
the workflow (qwen3_moe, CPU) is shared by the end-to-end tests.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import git
import pytest

from phases.add_moe_model import compat_doc, numerics, rules, tree_scripts
from phases.add_moe_model.error_triage import triage_error
from phases.add_moe_model.gap_recipes import build_all_patches
from phases.add_moe_model.workspace import EXP, new_run_workspace
from tests.conftest import clone_of, cli, make_repo

DOC = EXP + "MODEL_COMPATIBILITY.md"
UPSTREAM_TYPES = ("qwen3_moe", "mixtral", "deepseek_v3", "olmoe", "deepseek_v2", "glm4_moe", "glm_moe_dsa",
                  "gemma4_text")


def guard_state(target: Path) -> dict:
    return {"target": str(target), "base": {"commit": git.Repo(target).head.commit.hexsha}, "open_patches": {}}


def test_frozen_guard_reads_the_base_with_its_trailing_newline(tmp_path):
    repo = make_repo(tmp_path / "t", {rules.NE: "_MODEL_CONFIGS = {}\n", rules.NEP: "THRESHOLD = 1e-6\n"})
    state = guard_state(Path(repo.working_tree_dir))
    assert rules.frozen_thresholds_guard(state) is None
    (Path(repo.working_tree_dir) / rules.NEP).write_text("THRESHOLD = 1e-6")
    violation = rules.frozen_thresholds_guard(state)
    assert violation is not None and f"{rules.NEP} changed" in violation.message


def test_no_guard_fires_on_either_untouched_tree(main_snapshot, tmp_path):
    embedded = new_run_workspace(tmp_path / "state")
    for target in (main_snapshot, embedded):
        state = guard_state(target)
        for guard in (rules.frozen_thresholds_guard, rules.scope_guard, rules.forbidden_calls_guard):
            assert guard(state) is None, (target, guard.__name__, guard(state))


def test_a_broadcast_error_in_the_moe_is_not_blamed_on_the_expert_weights():
    seen_on_main = ("RuntimeError: output with shape [8] doesn't match the broadcast shape [16, 8] "
                    "[at moe.py:438 forward <- module.py:1789 _call_impl]")
    issue = triage_error("qwen3_moe", "RuntimeError", seen_on_main)
    assert issue.code == "numerics_error" and "moe.py:438" in issue.message


def test_an_unknown_layout_ends_the_phase_as_a_finding_naming_what_and_where():
    from phases.add_moe_model.work.numerics import CompareResult, RoundTrip

    error = ("UnknownMoeLayout: unknown MoE token layout: MoE.forward(self, h) at torchtitan/x/moe.py:12: "
             "its first argument names neither x_BLD nor x_TD")
    row = CompareResult(model_type="m", dtype="bfloat16", device="cpu", status="ERROR", seed=0,
                        roundtrip=RoundTrip(status="PASS"), error=error, error_type="UnknownMoeLayout")
    result = numerics.decide([row])
    assert result.outcome == "failed" and result.issues[0].code == "unknown_moe_layout"
    assert "torchtitan/x/moe.py:12" in result.issues[0].message


def test_layout_is_read_from_the_signature_or_one_call_in_each_shape():
    import torch

    from phases.add_moe_model.work import layout

    class Flat(torch.nn.Module):
        def forward(self, x_TD):
            return x_TD

    class Unnamed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(4, 4)

        def forward(self, hidden):
            assert hidden.dim() == 3, "takes (B, L, D)"
            return self.w(hidden)

    class Neither(Unnamed):
        def forward(self, hidden):
            return hidden.sum()

    assert layout.detect_moe_layout(Flat(), hidden=4).name == "TD"
    found = layout.detect_moe_layout(Unnamed(), hidden=4)
    assert found.name == "BLD" and "only the BLD call" in found.evidence
    with pytest.raises(layout.UnknownMoeLayout, match=r"Neither.forward\(self, hidden\) at .*test_moe_main_tree"):
        layout.detect_moe_layout(Neither(), hidden=4)
    x = torch.zeros(2, 3, 4)
    assert layout.MoeLayout(name="TD", evidence="").tokens(x).shape == (6, 4)


def test_tree_script_output_is_parsed_and_the_stricter_tier_stands():
    output = ("\nNumerical equivalence test (device=cpu, seed=42)\n"
              "  WARN   qwen3_moe             KL=2.00e-06  cos=0.999990  max_diff=7.81e-03\n"
              "State dict adapter round-trip test\n"
              "  PASS   qwen3_moe             round-trip max_diff=0.00e+00\n")
    answer = {"argv": ["python", "ne.py"], "returncode": 0, "output": output, "moe_inputs": []}
    script = tree_scripts.build_verdict(answer, model_type="qwen3_moe", our_layout="TD: x")
    assert (script.status, script.kl, script.roundtrip, script.finding) == ("WARN", 2e-06, "PASS", None)
    ours = {"status": "PASS", "kl": 5e-07}
    assert tree_scripts.standing(ours, script)["stands"] == "tree_script"
    assert tree_scripts.standing({"status": "WARN", "kl": 2e-6}, script)["stands"] == "builtin"


def glm5_results(*, core: bool) -> tuple[Any, Any]:
    """A GLM-5 DSA run's results (WARN, three UNRUN rows, a waiver) and its trail's seqs, as the doc phase reads."""
    from phases.add_moe_model.cited import Cited
    from phases.add_moe_model.records import Results

    finding = {"code": "indexer_tp_unsupported", "message": "the DSA indexer needs local tensors under TP",
               "fix_location": "torchtitan/models/common/attention.py", "severity": "core"}
    unrun = [{"config": c, "world_size": w, "tp": 1, "ep": 1, "command": "torchrun", "status": "UNRUN",
              "error": "no GPU here"} for c, w in (("FSDP-1gpu", 1), ("FSDP", 2), ("FSDP+EP", 2))]
    results = {
        "probe": {"model_type": "glm_moe_dsa", "score_func": "sigmoid", "top_k": 8, "num_experts": 256,
                  "route_norm": True, "hidden_size": 6144, "moe_intermediate_size": 2048, "num_hidden_layers": 78,
                  "shared_experts": "additive", "attention": "mla", "moe_mechanism": "first_k_dense_replace",
                  "min_layers_needed": 2, "issues": [finding] if core else []},
        "synthetic_config": {"entry": {"model_type": "glm_moe_dsa", "hidden_size": 6144, "n_routed_experts": 8,
                                       "num_experts_per_tok": 2, "num_hidden_layers": 2}},
        "numerics": {"verdict": {"status": "WARN", "kl": 2e-4, "max_diff": 0.1, "cos_sim": 0.99999,
                                 "roundtrip": {"status": "PASS"}}, "waived": {"raised_in_transformers": "HF's own"}},
        "parallelism": {"rows": unrun, "build_check": [{"world_size": 2, "tp": 1, "ep": 2, "status": "PASS"}],
                        "gpus": 0, "fsdp": {}, "torch_compat": {}}}
    waiver = {"key": "waive:numerics:raised_in_transformers"}
    trail = [{"seq": 0, "type": "answer_accepted", "phase": None, "data": waiver},
             *({"seq": seq, "type": "phase_completed", "phase": phase, "data": {"outcome": "passed"}}
               for seq, phase in enumerate(results, start=1))]
    return Results.model_validate(results), Cited.from_events("r", trail)


def test_doc_update_on_main_replaces_the_models_row_and_section_and_keeps_the_others(main_snapshot):
    from orchestrator.context import render_template

    def render(template: str, **values: Any) -> str:
        return render_template("add_moe_model", template, **values)

    before = (main_snapshot / DOC).read_text()
    results, cited = glm5_results(core=False)
    values = compat_doc.collect_values(results, options={"model_id": "zai-org/GLM-5"}, cited=cited)
    after = compat_doc.update_doc(before, values, render=render)
    for model_type in UPSTREAM_TYPES:
        assert after.count(f"| {model_type} |") == 1, model_type
    assert after.count("(glm_moe_dsa)") == 1 and "| GLM-5 (DSA) | glm_moe_dsa | WARN | 2.00e-04 |" in after
    assert "| GLM-5 DSA | PASS | PASS |" in after and "### GLM-5 (glm_moe_dsa)" not in after
    assert "torchrun FSDP-1gpu UNRUN (1 GPU), FSDP UNRUN (2 GPUs)" in after
    assert "- Not a clean pass: numerics WARN; parallelism rows 3 UNRUN; waived by a person" in after
    assert '  - waived by a person: numerics raised_in_transformers: "HF\'s own" (answer, seq 0)' in after
    assert "top-2 of 8 experts measured (synthetic entry), top-8 of 256 experts in the real model" in after
    untouched = [line for line in before.splitlines() if "glm_moe_dsa" not in line and "GLM-5" not in line]
    assert all(line in after.splitlines() for line in untouched if line.startswith("| "))
    core = "## Core Changes Needed for Full Support"
    assert after[after.index(core):] == before[before.index(core):]  # Gemma4's entries, nothing of ours
    results, cited = glm5_results(core=True)
    values = compat_doc.collect_values(results, options={"model_id": "zai-org/GLM-5"}, cited=cited)
    with_core = compat_doc.update_doc(after, values, render=render)
    entry = with_core[with_core.index(core):]
    assert "### GLM-5 (DSA) (glm_moe_dsa)" in entry and "indexer_tp_unsupported" in entry
    assert "### Configurable expert activation (for Gemma4)" in entry
    results, cited = glm5_results(core=False)
    values = compat_doc.collect_values(results, options={"model_id": "zai-org/GLM-5"}, cited=cited)
    assert compat_doc.update_doc(with_core, values, render=render) == after


def test_gap_recipes_apply_to_mains_core_files(main_snapshot, tmp_path):
    repo = git.Repo(clone_of(main_snapshot, tmp_path / "tt"))
    for patch in build_all_patches(Path(repo.working_tree_dir)):
        assert patch.status == "applicable", patch.reason
        diff = tmp_path / f"{patch.name}.diff"
        diff.write_text(patch.diff)
        repo.git.apply("--check", str(diff))


def _completed(trail: list[dict], phase: str) -> dict:
    return next(e for e in trail if e["type"] == "phase_completed" and e["phase"] == phase)["data"]["data"]


@pytest.mark.slow
def test_qwen3_on_main_reaches_a_verdict_and_commits_inside_the_experiment(main_qwen_run):
    assert main_qwen_run["code"] == 0, main_qwen_run["stderr"][-2000:]
    verdict = _completed(main_qwen_run["trail"], "numerics")["verdict"]
    assert verdict["status"] in ("PASS", "WARN") and verdict["moe_layout"].startswith("TD: MoE.forward(self, x_TD")
    repo = git.Repo(main_qwen_run["target"])
    files = list(repo.head.commit.stats.files)
    assert sorted(files) == sorted([DOC, rules.NE]), files
    doc = (main_qwen_run["target"] / DOC).read_text()
    assert all(doc.count(f"| {t} |") == 1 for t in UPSTREAM_TYPES) and doc.count("(qwen3_moe)") == 1
    state = main_qwen_run["state"]
    assert cli("audit", main_qwen_run["status"]["run_id"], state_dir=state).returncode == 0


@pytest.mark.slow
def test_gap_analysis_on_main_ends_at_zero_when_it_runs(main_qwen_run):
    """main's MoE takes x_TD and its core files sit at other lines: the recipes, the trace and its hypothesis find
    their code there too, and the gap closes at 0.00 as on 0.3.0 (when this CPU's tier sends the run there)."""
    trail = main_qwen_run["trail"]
    rows = [e["data"]["record"] for e in trail if e["type"] == "record_added" and e["data"]["kind"] == "gap_row"]
    if not any(e["phase"] == "gap_analysis" for e in trail):
        assert rows == []
        return
    assert rows[-1]["max_diff"] == 0.0 and rows[-1]["patch_id"], rows[-1]
    assert all(not r["description"].startswith("not applicable") for r in rows), rows


@pytest.mark.slow
def test_trees_own_script_runs_beside_and_its_failure_is_a_finding_with_its_cause(main_qwen_run):
    data = _completed(main_qwen_run["trail"], "numerics")
    script, stand = data["tree_script"], data["verdict_standing"]
    artifacts = main_qwen_run["state"] / "runs" / main_qwen_run["status"]["run_id"] / "artifacts"
    verbatim = (artifacts / "tree_script_numerics.txt").read_text()
    assert "State dict adapter round-trip test" in verbatim
    assert verbatim.rstrip().endswith(f"[exit {script['returncode']}]")
    assert script["status"] == "ERROR" and "  ERROR  qwen3_moe" in verbatim and stand["stands"] == "builtin"
    assert "feeds the Titan MoE input of shape [2, 16, 2048]" in script["finding"]
    assert "takes x_TD (2-D)" in script["finding"] and "moe.py:396" in script["finding"]
    notes = [e["data"]["text"] for e in main_qwen_run["trail"] if e["type"] == "note_added"]
    assert script["finding"] in notes


@pytest.mark.slow
def test_weights_run_the_pretrained_comparison_and_the_trees_pretrained_script(main_qwen_run):
    data = _completed(main_qwen_run["trail"], "numerics")
    ours, script = data["pretrained"], data["pretrained_tree_script"]
    assert ours["model"] == "tiny-qwen3-moe" and ours["status"] == ("PASS" if ours["kl"] < 1e-3 else "FAIL")
    artifacts = main_qwen_run["state"] / "runs" / main_qwen_run["status"]["run_id"] / "artifacts"
    report = (artifacts / "numerics_pretrained.txt").read_text()
    assert f"  {ours['status']:5s}  tiny-qwen3-moe" in report and f"KL={ours['kl']:.2e}" in report
    verbatim = (artifacts / "tree_script_pretrained.txt").read_text()
    assert "numerical_equivalence_pretrained.py --model_dir" in verbatim and "tiny-qwen3-moe" in verbatim
    assert script["status"] in ("PASS", "FAIL", "ERROR", "SKIP") and (script["finding"] is None) == (
        script["status"] in ("PASS", "FAIL"))
    doc = (main_qwen_run["target"] / DOC).read_text()
    assert f"- Pretrained weights (tiny-qwen3-moe, hidden 64): {ours['status']} KL={ours['kl']:.2e}" in doc
    names = [e["data"]["name"] for e in main_qwen_run["trail"] if e["type"] == "measurement_recorded"]
    assert "pretrained_kl" in names


def test_a_layout_the_target_declares_unsupported_is_not_an_unsharded_module():
    from phases.add_moe_model.parallelism import declared_unsupported

    dsa = {"status": "FAIL", "error": "NotImplementedError: GlmMoeDsaAttention: the DSA indexer is currently not "
                                      "supported under tensor parallelism [at hf_sharding.py:352]"}
    assert declared_unsupported(dsa)
    assert not declared_unsupported({"status": "FAIL", "error": None, "unsharded_modules": ["layers.0.mlp"]})
