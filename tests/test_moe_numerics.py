"""Phase 3a: the numerics worker on real synthetic models, and the phase's routing.

Slow tests run the worker in a fresh process (as ``ctx.call`` does) against the
installed torchtitan and transformers (torch 2.13, transformers 5.24, torchtitan 0.3.0) and
assert what holds on any CPU, with the reason for each: bf16 kernels differ between CPUs, so a
tier is pinned only where the KL sits orders of magnitude away from a threshold.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import jinja2
import pytest

from orchestrator.phase_api import PhaseResult
from orchestrator.templates_dir import templates_dir
from phases.add_moe_model import numerics as phase
from phases.add_moe_model.records import Numerics, Probe
from phases.add_moe_model.survey.outcome import numerics_summary
from phases.add_moe_model.work.firmness import judge_edge
from phases.add_moe_model.work.kl import classify_kl
from phases.add_moe_model.work.numerics import CompareResult, RoundTrip
from tests.conftest import call_handle, call_worker, make_repo

REPO = Path(__file__).resolve().parents[1]
COMMON = dict(num_hidden_layers=1, vocab_size=256, max_position_embeddings=64, attn_implementation="sdpa",
              use_cache=False)
SYNTHETIC = {
    "qwen3_moe": dict(model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                      num_experts=8, num_experts_per_tok=2, num_attention_heads=32, num_key_value_heads=4,
                      head_dim=128, norm_topk_prob=True, decoder_sparse_step=1, **COMMON),
    "olmoe": dict(model_type="olmoe", hidden_size=2048, intermediate_size=1024, num_experts=8, num_experts_per_tok=2,
                  num_attention_heads=16, num_key_value_heads=16, **COMMON),
    "deepseek_v3": dict(model_type="deepseek_v3", hidden_size=7168, intermediate_size=18432,
                        moe_intermediate_size=2048, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
                        n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=0,
                        num_attention_heads=8, num_key_value_heads=8, q_lora_rank=None, kv_lora_rank=16,
                        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, **COMMON),
    "gpt_oss": dict(model_type="gpt_oss", hidden_size=2880, intermediate_size=2880, num_local_experts=8,
                    num_experts_per_tok=2, num_attention_heads=64, num_key_value_heads=8, head_dim=64, **COMMON),
    "gemma4_text": dict(model_type="gemma4_text", hidden_size=2816, intermediate_size=2112, moe_intermediate_size=704,
                        num_experts=8, top_k_experts=2, enable_moe_block=True, num_attention_heads=16,
                        num_key_value_heads=8, head_dim=256, hidden_size_per_layer_input=0, **COMMON),
}


def test_kl_tiers_are_our_constants() -> None:
    observed = [classify_kl(v) for v in (0.0, 9.9e-7, 1e-6, 9.9e-4, 1e-3, float("nan"))]
    assert observed == ["PASS", "PASS", "WARN", "WARN", "FAIL", "FAIL"]


def test_engine_side_modules_do_not_import_torch() -> None:
    code = ("import sys; import phases.add_moe_model.numerics, phases.add_moe_model.gap_recipes, "
            "phases.add_moe_model.forbidden, phases.add_moe_model.work.numerics, "
            "phases.add_moe_model.work.build_check; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _result(status: str, *, dtype: str = "bfloat16", rt: str = "PASS", **extra: Any) -> CompareResult:
    measured = status in ("PASS", "WARN", "FAIL")
    metrics = dict(kl=2e-5, cos_sim=0.99999, max_diff=3e-2, mean_diff=1e-3) if measured else {}
    return CompareResult(model_type="mixtral", dtype=dtype, device="cpu", status=status, seed=42,
                         roundtrip=RoundTrip(status=rt, max_diff=0.0), **{**metrics, **extra})


def test_decide_routes_on_the_bf16_verdict_only() -> None:
    assert phase.decide([_result("PASS"), _result("FAIL", dtype="float32")]).route == "pass"
    for status in ("WARN", "FAIL"):
        decided = phase.decide([_result(status), _result("PASS", dtype="float32")])
        assert (decided.outcome, decided.route) == ("passed", "gap")


def test_a_pass_that_its_spread_carries_across_the_threshold_takes_the_safe_side() -> None:
    firm = {"kl_fp64": 8e-7, "kl_perturbed": 1.3e-6, "spread": 5e-7, "edge": "PASS|WARN"}
    decided = phase.decide([_result("PASS", kl=8e-7, firmness=firm), _result("PASS", dtype="float32")])
    assert (decided.outcome, decided.route) == ("passed", "gap")
    assert decided.summary.startswith("PASS mixtral") and "one-ulp spread 5.00e-07 reaching WARN" in decided.summary
    assert "PASS|WARN" not in decided.summary
    firm = {**firm, "spread": 1e-8, "edge": None}
    assert phase.decide([_result("PASS", kl=8e-7, firmness=firm)]).route == "pass"
    text = _render("numerics_table.txt.j2", table=phase.build_table([_result("PASS", kl=8e-7, firmness={
        "kl_fp64": 8e-7, "kl_perturbed": 1.3e-6, "spread": 5e-7, "edge": "PASS|WARN"})]))
    assert ("  bfloat16   KL=8.00e-07  KL(fp64)=8.00e-07  spread=5.00e-07  tier PASS (one-ulp spread reaches WARN)"
            in text)
    text = _render("numerics_table.txt.j2", table=phase.build_table([_result("PASS", kl=8e-7, firmness={
        **firm, "other_kernel": "eager", "kl_other_kernel": 9e-7})]))
    assert "spread=1.00e-08  tier PASS  eager experts KL=9.00e-07" in text


def test_a_tier_is_one_tier_everywhere_and_a_routing_flip_is_counted_not_called_an_edge() -> None:
    wide = {"kl_fp64": 3e-5, "kl_perturbed": 2.07e-2, "spread": 2.07e-2, "edge": "PASS|FAIL"}
    decided = phase.decide([_result("WARN", kl=3.01e-5, firmness=wide)])
    assert decided.summary.startswith("WARN mixtral") and "reaching PASS and FAIL" in decided.summary
    table = phase.build_table([_result("WARN", kl=3.01e-5, firmness=wide)])
    assert table.firmness_lines[0].split("  tier ")[1].startswith("WARN (one-ulp spread reaches PASS and FAIL)")
    none = {"tokens": 0, "outlier_tokens": 0, "kl_without_outliers": None}
    assert judge_edge(3.01e-5, 2.07e-2, none, none, classify=classify_kl) == {"edge": "PASS|FAIL", "flipped": None}
    moved = {"tokens": 64, "outlier_tokens": 3, "kl_without_outliers": 1e-6}
    judged = judge_edge(3.01e-5, 2.07e-2, none, moved, classify=classify_kl)
    assert judged == {"edge": None, "flipped": {"tokens": 3, "of": 64}}
    flipped = phase.decide([_result("WARN", kl=3.01e-5, firmness={**wide, **judged})])
    assert "the one-ulp move routes 3 of 64 tokens differently on each side (KL then 2.07e-02)" in flipped.summary
    assert "reaching" not in flipped.summary and "|" not in flipped.summary
    row = numerics_summary(Numerics.model_validate({"verdict": {"status": "WARN", "kl": 3.01e-5, "firmness": wide}}))
    assert row["tier"] == "WARN" and row["tier_shown"] == "WARN (one-ulp spread reaches PASS and FAIL)"


def test_cosine_of_identical_outputs_is_one_at_the_skills_sizes() -> None:
    import torch

    from phases.add_moe_model.work.kl import measure_output_gap

    x = torch.randn(4_000_000, generator=torch.Generator().manual_seed(0)) * 3
    assert measure_output_gap(x, x.clone())["cos_sim"] <= 1.0  # fp32 summation said 1.00017
    assert measure_output_gap(x, -x)["cos_sim"] == pytest.approx(-1.0)


def test_decide_triages_errors_skips_and_bad_round_trips() -> None:
    probe = phase.decide([_result(
        "ERROR", error_type="ValueError",
        error="ValueError: Could not determine top_k [at moe_replacement.py:1 _resolve_top_k]")])
    assert probe.outcome == "needs_agent" and probe.issues[0].code == "probe_value_error"
    load = phase.decide([_result("ERROR", error_type="RuntimeError",
                                 error="RuntimeError: Error(s) in loading state_dict: size mismatch for w1")])
    assert load.issues[0].fix_location == "state_dict_adapter.py"
    gmm = phase.decide([_result("ERROR", error_type="RuntimeError", error="RuntimeError: grouped_mm: bad offs")])
    assert gmm.issues[0].code == "grouped_mm_shape_error"
    skipped = phase.decide([_result("SKIP")])  # the synthetic entry is ours: a person's call, not the agent's
    assert skipped.issues[0].code == "no_moe_layer" and skipped.outcome == "needs_human"
    rt = phase.decide([_result("PASS", rt="FAIL")])
    assert rt.outcome == "needs_agent" and rt.issues[0].code == "state_dict_roundtrip_failed"
    hf = phase.decide([_result("ERROR", error_type="RuntimeError", error="RuntimeError: expected m1 and m2 ...",
                               error_origin="transformers", error_frame="transformers/models/llama4/x.py:80 forward")])
    assert hf.outcome == "needs_human" and hf.issues[0].code == "raised_in_transformers"
    assert "transformers/models/llama4/x.py:80" in hf.issues[0].fix_location and "EXP" not in hf.issues[0].fix_location


def _render(template: str, **values: Any) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(templates_dir("add_moe_model")),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    return env.get_template(template).render(**values)


def test_table_uses_the_skill_stdout_format() -> None:
    rows = [_result("WARN", kl=4.62e-05, max_diff=3.125e-02, cos_sim=0.9999871),
            _result("WARN", dtype="float32", kl=1e-7, max_diff=1e-3, cos_sim=1.0)]
    text = _render("numerics_table.txt.j2", table=phase.build_table(rows))
    assert "  WARN   mixtral               KL=4.62e-05  cos=0.999987  max_diff=3.12e-02\n" in text
    assert "  PASS   mixtral               round-trip max_diff=0.00e+00\n" in text
    assert "All models passed" not in text, "a WARN row under a line that says every model passed"
    assert ("No model failed; mixtral did not PASS outright (WARN, or a spread that reaches WARN): "
            "gap analysis follows.") in text
    assert "Diagnostic, not the verdict" in text
    passed = _render("numerics_table.txt.j2", table=phase.build_table([_result("PASS", kl=1e-8)]))
    assert "All models passed numerical equivalence." in passed
    failed = _render("numerics_table.txt.j2", table=phase.build_table([_result("ERROR", error="boom")]))
    assert "  ERROR  mixtral               boom" in failed and "Some models FAILED" in failed
    skipped = _render("numerics_table.txt.j2", table=phase.build_table([_result("SKIP", error="no MoE layer")]))
    assert "Not measured: mixtral (SKIP)" in skipped and "gap analysis follows" not in skipped


class _Ctx:
    """A PhaseContext stand-in: real worker subprocess, real template, in-memory trail."""

    def __init__(self, tmp: Path, entry: dict) -> None:
        self.results = {"synthetic_config": {"entry": entry}}
        self.options = {"device": "cpu"}
        self.artifacts: dict[str, str] = {}
        self.measurements: list[dict] = []
        self.artifacts_dir = tmp
        # a repository without numerical_equivalence.py, as torchtitan 0.3.0 ships none
        self.target = tmp / "target"
        self.base = {"commit": make_repo(self.target, {"README": "target\n"}).head.commit.hexsha}
        self.records: list[tuple[str, dict]] = []

    def progress(self, message: str) -> None:
        pass

    def plan(self, steps: int) -> None:
        pass

    def result(self, phase_name: str, model: Any) -> Any:
        return model.model_validate(self.results[phase_name])

    def add_record(self, kind: str, record: dict) -> None:
        self.records.append((kind, record))

    def note(self, text: str, *, kind: str = "devlog") -> None:
        self.records.append((kind, {"text": text}))

    def call(self, worker: Any, request: Any, **_: Any) -> Any:
        return call_handle(worker, request)

    def write_artifact(self, name: str, content: str) -> str:
        self.artifacts[name] = content
        return name

    def render(self, template: str, **values: Any) -> str:
        return _render(template, **values)

    def record_measurement(self, **kwargs: Any) -> None:
        self.measurements.append(kwargs)


@pytest.fixture(scope="session")
def qwen3_phase(tmp_path_factory: pytest.TempPathFactory) -> tuple[_Ctx, PhaseResult]:
    ctx = _Ctx(tmp_path_factory.mktemp("numerics"), SYNTHETIC["qwen3_moe"])
    return ctx, phase.run(ctx)


@pytest.mark.slow
def test_phase_on_qwen3_warns_with_artifacts_and_measurements(qwen3_phase: tuple[_Ctx, PhaseResult]) -> None:
    ctx, result = qwen3_phase
    # qwen3_moe sits at the PASS/WARN edge (the skill's GPU table: 5.31e-07; CPUs differ in their
    # bf16 kernels: KL ~1.0e-6 on one 2-core host, 8.2e-08 on an AMX-BF16 one). What holds on any
    # CPU: the tier is the one our thresholds give, it is not FAIL (the mapping is faithful), and
    # the route follows the tier.
    verdict = result.data["verdict"]
    assert verdict["status"] == classify_kl(verdict["kl"]) != "FAIL", verdict
    firm_pass = verdict["status"] == "PASS" and not verdict["firmness"]["edge"]
    assert (result.outcome, result.route) == ("passed", "pass" if firm_pass else "gap"), verdict["firmness"]
    assert verdict["hf_experts_impl"] == "grouped_mm" and verdict["device"] == "cpu"
    firm = verdict["firmness"]
    assert firm["other_kernel"] == "eager" and math.isfinite(firm["kl_other_kernel"]), firm
    assert "eager experts KL=" in ctx.artifacts["numerics.txt"]
    assert verdict["load"] == {"missing": [], "unexpected": [], "ours": []}
    assert result.data["measured_tree"] == {}, "numerics records what it measured: here the base's folder"
    assert verdict["roundtrip"]["status"] == "PASS" and verdict["roundtrip"]["max_diff"] == 0.0
    assert 0.0 < verdict["max_diff"] < 0.05
    saved = json.loads(ctx.artifacts["numerics.json"])
    assert [r["dtype"] for r in saved] == ["bfloat16", "float32"]
    assert f"  {verdict['status']:<5}  qwen3_moe             KL=" in ctx.artifacts["numerics.txt"]
    names = {(m["name"], m["labels"]["dtype"]) for m in ctx.measurements}
    assert ("numerics_kl", "bfloat16") in names and ("numerics_max_diff", "float32") in names
    assert all(m["provenance"]["versions"]["torch"] for m in ctx.measurements)


@pytest.mark.slow
def test_olmoe_is_not_a_fail() -> None:
    # Softmax router without normalisation (norm_topk_prob False) maps 1:1 to Titan's router. The bf16
    # KL is at the estimator's noise level (-7.5e-07 on one CPU: negative), so the tier may be PASS
    # or WARN by CPU; never FAIL.
    out = call_worker("phases.add_moe_model.work.numerics:compare_dtypes",
                      {"model_type": "olmoe", "config_kwargs": SYNTHETIC["olmoe"], "dtypes": ["bfloat16"],
                       "device": "cpu"})
    (r,) = out["results"]
    assert r["status"] == classify_kl(r["kl"]) != "FAIL", r
    assert r["roundtrip"]["status"] == "PASS"


@pytest.mark.slow
def test_gemma4_fails_and_the_fp32_diagnostic_flags_a_semantic_gap() -> None:
    # Gemma4's router has an input RMSNorm, a learned scale and per_expert_scale, and its
    # experts use GeGLU; Titan's router/experts have none of these (skill's table: FAIL,
    # KL 4.19e-03, cos 0.946). Observed here: KL ~4e-3, cos ~0.949 in bf16 AND fp32, which
    # the phase flags; the adapter leaves router.scale / router.per_expert_scale unused.
    out = call_worker("phases.add_moe_model.work.numerics:compare_dtypes",
                      {"model_type": "gemma4_text", "config_kwargs": SYNTHETIC["gemma4_text"],
                       "dtypes": ["bfloat16", "float32"], "device": "cpu"})
    bf16, fp32 = out["results"]
    assert bf16["moe_kind"] == "layer"
    assert bf16["status"] == "FAIL" and bf16["kl"] >= 1e-3, bf16
    assert bf16["cos_sim"] < 0.99 and fp32["cos_sim"] < 0.99, (bf16["cos_sim"], fp32["cos_sim"])
    assert set(bf16["load"]["unexpected"]) == {"router.per_expert_scale", "router.scale"}
    # The probe's core finding says why Titan has no place for them; the dropped keys follow it to a person.
    probe = {"strict_load": "FAIL", "issues": [{"code": "router_scale_ignored", "severity": "core", "fix_location": "x",
                                                "message": "Gemma4TextRouter scales routing with ['scale', "
                                                           "'per_expert_scale']"}]}
    decided = phase.decide([CompareResult.model_validate(r) for r in out["results"]],
                           probe=Probe.model_validate({"model_type": "gemma4_text", **probe}))
    assert decided.route == "gap" and decided.data["diagnostic_flags"], decided.summary
    assert decided.outcome == "needs_human" and decided.issues[0].code == "titan_lacks_converted_keys"


@pytest.mark.slow
def test_deepseek_v3_fails_in_bf16_and_the_adapter_drops_the_score_bias() -> None:
    # Observed on CPU: bf16 FAIL (KL ~0.27, cos ~0.974, max_diff ~17.8) while the fp32
    # diagnostic is WARN (KL ~1.1e-04, max_diff ~7.9e-02): dtype, not a semantic bug. Kernel
    # alignment shows Titan's experts+combine are exact on HF's routing once patched, so
    # the bf16 gap is routing: on CPU Titan's gate autocast(fp32) is inactive, the sigmoid
    # + group-limited top-k then picks other experts for some tokens (x2.5 scaling).
    # The adapter maps gate.e_score_correction_bias to "expert_bias", a key Titan's MoE does
    # not have (its buffer is expert_bias_E, absent with load_balance_coeff=None).
    out = call_worker("phases.add_moe_model.work.numerics:compare_dtypes",
                      {"model_type": "deepseek_v3", "config_kwargs": SYNTHETIC["deepseek_v3"],
                       "dtypes": ["bfloat16", "float32"], "device": "cpu"})
    bf16, fp32 = out["results"]
    assert bf16["status"] == "FAIL" and fp32["status"] == "WARN", (bf16, fp32)
    assert bf16["load"] == {"unexpected": ["expert_bias"], "missing": ["expert_bias_E"], "ours": []}
    assert bf16["roundtrip"]["status"] == "PASS"
    # The dropped bias is the adapter's (the probe's router_bias_key_misnamed), not a verdict to route on.
    decided = phase.decide([CompareResult.model_validate(r) for r in out["results"]])
    assert (decided.outcome, decided.route) == ("needs_agent", "gap")
    assert [i.code for i in decided.issues] == ["adapter_keys_dropped"]


@pytest.mark.slow
def test_gpt_oss_synthetic_rule_sdpa_is_an_error_raised_in_transformers_for_a_person() -> None:
    # The skill's synthetic rule says attn_implementation="sdpa"; transformers 5.24 refuses
    # sdpa for GptOss (attention sinks), so the HF model cannot be built: ERROR, not a pass.
    # The refusal is raised in transformers' own code, which no edit under EXP/ changes.
    out = call_worker("phases.add_moe_model.work.numerics:compare_dtypes",
                      {"model_type": "gpt_oss", "config_kwargs": SYNTHETIC["gpt_oss"], "dtypes": ["bfloat16"],
                       "device": "cpu"})
    (r,) = out["results"]
    assert r["status"] == "ERROR" and "scaled_dot_product_attention" in r["error"], r
    decided = phase.decide([CompareResult.model_validate(r)])
    assert decided.outcome == "needs_human", decided
    # Blind trial (flint): the round trip never ran, so it blames no adapter (it read state_dict_roundtrip_failed).
    assert r["roundtrip"]["status"] == "SKIP" and "not run" in r["roundtrip"]["error"], r["roundtrip"]
    assert {i.code for i in decided.issues} == {"raised_in_transformers"}, decided.issues


@pytest.mark.slow
def test_gpt_oss_with_eager_attention_hits_the_transposed_expert_layout() -> None:
    # GptOss stores experts as (E, H, 2I) with the hidden dim first; the target's probe reads
    # gate_up_proj.shape[1] // 2 as I, builds Titan experts for I=1440 with the wrong width,
    # and load_state_dict reports the size mismatch: the skill's "experts transposed" row.
    kwargs = {**SYNTHETIC["gpt_oss"], "attn_implementation": "eager"}
    out = call_worker("phases.add_moe_model.work.numerics:compare_dtypes",
                      {"model_type": "gpt_oss", "config_kwargs": kwargs, "dtypes": ["bfloat16"], "device": "cpu"})
    (r,) = out["results"]
    assert r["status"] == "ERROR" and "size mismatch" in r["error"], r
    assert r["roundtrip"]["status"] == "PASS"
    decided = phase.decide([CompareResult.model_validate(r)])
    assert decided.issues[0].code == "adapter_shape_mismatch"
    assert decided.issues[0].fix_location == "state_dict_adapter.py"


def test_numerics_finds_the_moe_wherever_the_probe_does() -> None:
    # Blind trial: granitemoe keeps its MoE at layer.block_sparse_moe; after the agent taught the
    # target that name the probe was clean, but numerics looked only under mlp/feed_forward and
    # SKIPped with "no MoE layer in the synthetic model".
    from transformers import GraniteMoeConfig, GraniteMoeForCausalLM

    from phases.add_moe_model.work.moe_blocks import find_moe_site

    config = GraniteMoeConfig(hidden_size=32, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                              num_key_value_heads=2, vocab_size=32, num_local_experts=4, num_experts_per_tok=2)
    site = find_moe_site(GraniteMoeForCausalLM(config))
    assert site is not None and (site.kind, site.attr) == ("block", "block_sparse_moe")
    assert site.router is site.block.router and site.experts is site.block.experts
