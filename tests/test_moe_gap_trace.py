"""What the gap analysis reads off a stage trace, and the words it may use for it.

The traces below have the shape ``work/stage_trace.py`` returns; their numbers are those it measured for
deepseek_v32 on a 2-core CPU (after the three recipes; with Titan's experts left in bf16 for the fp32 one).
The real traces run in tests/test_moe_gap_recipes.py and tests/test_moe_gap_cpu.py.
"""

from __future__ import annotations

import re
from pathlib import Path

from phases.add_moe_model import gap_trace
from phases.add_moe_model.work.stage_trace import STAGES

ROOT = Path(__file__).resolve().parents[1]


def _trace(values: dict[str, tuple], *, below: list | None = None, kernel: dict | None = None,
           dtype: str = "bfloat16") -> dict:
    stages = []
    for name in STAGES:
        max_diff, hf_dtype, titan_dtype = values.get(name, (0.0, dtype, dtype))
        stages.append({"stage": name, "max_diff": max_diff, "hf_dtype": hf_dtype, "titan_dtype": titan_dtype,
                       "detail": "", "tokens_routed_differently": 0 if name == "routing" else None})
    first = next((s["stage"] for s in stages if (s["max_diff"] or 0) > 0), None)
    return {"status": "traced", "model_type": "deepseek_v32", "dtype": dtype, "device": "cpu", "seed": 42,
            "stages": stages, "first_divergence": first, "titan_matmuls_below_run_dtype": below or [],
            "kernel": kernel or {"hf_kernel_on_titan_weights_max_diff": 0.0, "block_with_hf_kernel_max_diff": 0.125,
                                 "hf_experts_impl": "grouped_mm"}}


ROUTER = _trace({"router logits": (1.42e-2, "float32", "bfloat16"), "routing": (1.01e-2, "float32", "bfloat16"),
                 "block": (0.125, "bfloat16", "bfloat16")})
GROUPED_BF16 = [{"module": "routed_experts.inner_experts", "op": "_grouped_mm", "dtypes": ["bfloat16"], "calls": 3}]
EXPERTS_FP32 = _trace({"expert outputs": (6.3e-3, "float32", "float32"), "combine": (4.9e-3, "float32", "float32"),
                       "block": (4.9e-3, "float32", "float32")}, below=GROUPED_BF16, dtype="float32",
                      kernel={"hf_kernel_on_titan_weights_max_diff": 0.0, "block_with_hf_kernel_max_diff": 0.0})


def test_a_router_logits_divergence_in_a_lower_dtype_points_to_the_fp32_gate_once() -> None:
    builder, label = gap_trace.pick_hypothesis(ROUTER, tried=set())
    assert label == gap_trace.FP32_ROUTER_GATE and builder.__name__ == "build_fp32_router_gate_patch"
    assert gap_trace.pick_hypothesis(ROUTER, tried={label}) is None, "each hypothesis is tested once"
    same_dtype = _trace({"router logits": (1e-6, "float32", "float32"), "block": (0.125, "bfloat16", "bfloat16")})
    assert gap_trace.pick_hypothesis(same_dtype, tried=set()) is None, "no built-in hypothesis: the agent's"


def test_expert_outputs_below_the_run_dtype_point_to_the_experts_casts_not_to_a_kernel() -> None:
    """HF's kernel in Titan's block gives 0.00 here, yet Titan's grouped matmuls ran in bf16 in an fp32 run:
    that is the experts' cast, not a kernel difference, and it is not called one."""
    _, label = gap_trace.pick_hypothesis(EXPERTS_FP32, tried=set())
    assert label == gap_trace.EXPERTS_RUN_DTYPE and not gap_trace.kernel_verified(EXPERTS_FP32)
    same_dtype = {**EXPERTS_FP32, "titan_matmuls_below_run_dtype": []}
    assert gap_trace.kernel_verified(same_dtype) and gap_trace.pick_hypothesis(same_dtype, tried=set()) is None
    assert "verified kernel difference" in gap_trace.describe(same_dtype, table="gap_trace-9.md")


def test_the_descriptions_state_the_measured_stage_and_call_the_rest_not_explained() -> None:
    text = gap_trace.describe(ROUTER, table="gap_trace-55.md")
    assert text == ("stage trace (gap_trace-55.md): first divergence at router logits: max_diff 1.42e-02, "
                    "HF float32, Titan bfloat16")
    later = gap_trace.describe(EXPERTS_FP32, table="t.md")
    assert "first divergence at expert outputs" in later and "every stage before it 0.00" in later
    nothing = _trace({"block": (0.125, "bfloat16", "bfloat16")})
    nothing["first_divergence"] = None
    assert gap_trace.describe(nothing, table="t.md").endswith("not explained")
    failed = {"status": "ERROR", "error": "IndexError: boom", "stages": []}
    assert "not explained" in gap_trace.describe(failed, table="t.md")
    assert "router logits (max_diff 1.42e-02" in gap_trace.ask_text(ROUTER)


BANNED = re.compile(r"accepted on CPU|without a trace|\blikely\b|\bprobably\b|is not its cause|the likely cause")
GAP_TEXT_FILES = ("phases/add_moe_model/gap_analysis.py", "phases/add_moe_model/gap_trace.py",
                  "phases/add_moe_model/gap_hypotheses.py", "phases/add_moe_model/gap_recipes.py",
                  "phases/add_moe_model/numerics.py", "phases/add_moe_model/tier_text.py",
                  "phases/add_moe_model/caveats.py", "phases/add_moe_model/work/stage_trace.py",
                  "phases/add_moe_model/work/numerics.py", "templates/add_moe_model/gap_table.md.j2",
                  "templates/add_moe_model/gap_trace.md.j2", "templates/add_moe_model/numerics_table.txt.j2")


def test_no_gap_or_numerics_text_names_a_cause_by_inference() -> None:
    """The blind trial's committed sentence ("... so the fp32 router autocast is not its cause: ..., accepted on CPU
    without a trace") came from gap_analysis.py; no text that reaches a report may reason its way to a cause."""
    found = [f"{rel}:{n}: {line.strip()}" for rel in GAP_TEXT_FILES
             for n, line in enumerate((ROOT / rel).read_text().splitlines(), 1) if BANNED.search(line)]
    assert found == []
