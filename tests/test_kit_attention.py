"""Step 1's attention check: FLOPs counted from the real SDPA calls, the floor at a measured GEMM rate, and
what the row says (backend choice when attention is the largest family and far from its floor; the math
path on CUDA)."""

from __future__ import annotations

import pytest

from phases.kit.attention import attention_flops, causal_pairs
from phases.local_compile_perf.attention_floor import floor_rows
from phases.local_compile_perf.records import Cell


def test_causal_pairs_count_the_lower_triangle_aligned_to_the_last_key():
    assert causal_pairs(4, 4) == 4 + 3 + 2 + 1
    assert causal_pairs(2, 4) == 3 + 4  # queries are the last two positions
    assert causal_pairs(1, 1) == 1


def test_flops_follow_the_shapes_mla_head_dims_and_gqa():
    # q (B, Hq, S, d_qk), k (B, Hkv, S, d_qk), v (B, Hkv, S, d_v): 2 * B * Hq * pairs * (d_qk + d_v)
    assert attention_flops((2, 8, 16, 24), (2, 2, 16, 24), (2, 2, 16, 8), causal=False) == 2 * 2 * 8 * 256 * 32
    assert attention_flops((1, 4, 16, 24), (1, 4, 16, 24), (1, 4, 16, 8), causal=True) == 2 * 4 * 136 * 32


def test_count_attention_sees_every_call_of_a_real_step_and_leaves_its_result_alone():
    import torch

    from phases.kit.attention import count_attention

    q = torch.randn(1, 4, 16, 24, requires_grad=True)
    k, v = torch.randn(1, 4, 16, 24), torch.randn(1, 4, 16, 8)
    mask = torch.ones(16, 16, dtype=torch.bool)
    out = {}

    def step():
        causal = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        masked = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out["y"] = causal
        (causal.sum() + masked.sum()).backward()

    counted = count_attention(step)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.equal(out["y"], expected)
    assert counted.calls == 2
    causal_fwd = attention_flops((1, 4, 16, 24), (1, 4, 16, 24), (1, 4, 16, 8), causal=True)
    assert counted.flops_fwd == causal_fwd + 2 * 4 * 256 * 32  # a mask is computed in full
    assert counted.flops_fwdbwd == 3 * counted.flops_fwd
    assert sorted(s.split()[-1] for s in counted.shapes) == ["causal", "mask"]


def test_gemm_rate_on_a_host_is_labelled_and_follows_its_formula():
    import torch

    from phases.kit.attention import measure_gemm_rate

    rate = measure_gemm_rate("cpu", torch.float32, size=64, min_seconds=0.05)
    assert rate.reps >= 1 and (rate.seconds >= 0.05 or rate.reps >= 1000) and "host CPU" in rate.label
    assert rate.tflops == pytest.approx(2 * 64**3 * rate.reps / rate.seconds / 1e12)


def eager_cell(attention_ms: float, gemm_ms: float, kernels: tuple[str, ...]) -> Cell:
    return Cell(variant="eager", tree="eager", tokens=4096, status="measured",
                families=({"family": "attention", "count_per_step": 2, "ms_per_step": attention_ms},
                          {"family": "gemm", "count_per_step": 9, "ms_per_step": gemm_ms}),
                attention={"calls": 2, "shapes": ["q[1, 128, 4096, 192] causal"], "flops_fwd": 10**12,
                           "flops_fwdbwd": 3 * 10**12, "kernels": list(kernels)})


def test_largest_and_far_from_its_floor_is_a_backend_choice_and_math_on_cuda_is_said():
    rate = {"tflops": 600.0}  # 3 TFLOP at 600 TFLOP/s: a 5 ms floor
    far = floor_rows([eager_cell(20.0, 8.0, ("flash_fwd_kernel", "flash_bwd_kernel"))], rate, cuda=True)[0]
    assert far.floor_ms == pytest.approx(5.0) and far.ratio == pytest.approx(4.0) and far.largest
    assert "backend choice" in far.note and "math path" not in far.note
    near = floor_rows([eager_cell(6.0, 8.0, ("cudnn_generated_fort_native_sdpa",))], rate, cuda=True)[0]
    assert not near.largest and "within 2x" in near.note
    math = floor_rows([eager_cell(6.0, 8.0, ())], rate, cuda=True)[0]
    assert "math path" in math.note
    host = floor_rows([eager_cell(6.0, 8.0, ("aten::_scaled_dot_product_flash_attention_for_cpu",))], rate,
                      cuda=False)[0]
    assert "math path" not in host.note and "within 2x" in host.note
    # the trial of 2026-12-04: 0.210 ms against a 472.856 ms floor on CPU read "within 2x of its floor"
    below = floor_rows([eager_cell(0.2, 8.0, ("aten::_scaled_dot_product_flash_attention_for_cpu",))], rate,
                       cuda=False)[0]
    assert below.note.startswith("below its FLOP floor, which no kernel can be") and "within" not in below.note


def test_cold_compile_is_the_first_call_less_a_step_and_a_failed_process_says_so():
    from phases.local_compile_perf.cold_compile import cold_row

    variant = {"name": "cold swiglu", "tree": "regions:swiglu"}
    ok = {"status": "ok", "log_tail": "", "host_load": 1.5,
          "result": {"16": {"timing": {"compile_ms": 21_000.0, "samples_ms": [40.0, 60.0]}}}}
    assert cold_row({"variant": variant, "runs": [ok]}, 16) == {
        "name": "swiglu", "tree": "regions:swiglu", "host_load": 1.5, "status": "measured", "compile_s": 20.95,
        "first_call_ms": 21_000.0, "step_ms": 50.0}
    failed = {"status": "FAILED", "log_tail": "InductorError: boom", "result": None}
    row = cold_row({"variant": variant, "runs": [failed]}, 16)
    assert row["status"] == "failed" and "InductorError: boom" in row["reason"]
    tail = ("RuntimeError: fn_edge.is_valid() == this_edge.is_valid() INTERNAL ASSERT FAILED at \"tensor.cpp\":136\n\n"
            "Set TORCHDYNAMO_VERBOSE=1 for the internal stack trace\n")
    row = cold_row({"variant": variant, "runs": [{**failed, "log_tail": tail}]}, 16)
    assert row["reason"] == ("fresh process FAILED: RuntimeError: fn_edge.is_valid() == this_edge.is_valid() "
                             "INTERNAL ASSERT FAILED at \"tensor.cpp\":136"), "one line: it sits in a table row"


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_activation_checkpointing_keeps_the_loss_and_every_grad(mode):
    """The re-timing under the recipe's AC mode measures the same step: checkpointed layers, same numbers."""
    import torch

    from phases.kit.harness import build_tree_workload
    from tests.test_kit_tiny_harness import build_harness

    def run(ac_mode: str):
        work = build_tree_workload(build_harness(), "eager", tokens=16, device="cpu", dtype=torch.float32, seed=0,
                                   ac_mode=ac_mode)
        loss = work.step()
        return work, loss, [p.grad.clone() for p in work.layers.parameters()]

    _, loss, grads = run("none")
    wrapped, loss_ac, grads_ac = run(mode)
    assert all("CheckpointWrapper" in type(layer).__name__ for layer in wrapped.layers)
    assert torch.equal(loss, loss_ac) and all(torch.allclose(a, b) for a, b in zip(grads, grads_ac))


def test_an_unknown_ac_mode_is_refused():
    from phases.kit.activation_checkpoint import apply_activation_checkpointing

    with pytest.raises(ValueError, match="AC mode 'sometimes'"):
        apply_activation_checkpointing(object(), "sometimes")
