"""CPU tests of the measurement kit on tiny modules (timing, profiler, bandwidth, ideal, graphs)."""

from __future__ import annotations

import time

import pytest
import torch

from phases.kit.bandwidth import measure_bandwidth
from phases.kit.cudagraph import measure_cuda_graph_replay
from phases.kit.graphs import build_shape_pass, count_graphs
from phases.kit.ideal import boundary_bytes, ideal_ms, record_op_bytes, sum_bytes
from phases.kit.profile import classify_kernel, profile_kernels
from phases.kit.records import NotApplicable, Timing
from phases.kit.timing import measure_step
from tests.test_kit_tiny_harness import REGIONS, build_harness


def test_measure_step_keeps_every_sample_and_times_the_first_call_apart():
    calls = []

    def step():
        time.sleep(0.2 if not calls else 0.002)
        calls.append(1)

    t = measure_step(step, warmup=2, iters=7, device="cpu")
    assert len(calls) == 9 and len(t.samples_ms) == 7
    assert t.timer == "host" and t.compile_ms >= 200
    assert all(1.5 < s < 1000 for s in t.samples_ms), t.samples_ms
    assert isinstance(t.peak_memory, NotApplicable) and "CUDA" in t.peak_memory.reason
    assert Timing.model_validate_json(t.model_dump_json()) == t


def test_cuda_graph_replay_is_not_applicable_on_cpu():
    res = measure_cuda_graph_replay(lambda: None, device="cpu")
    assert res == NotApplicable(reason="no CUDA device")


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("triton_poi_fused_add_mul_0", "pointwise"),
        ("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_1", "reduction"),
        ("triton_red_fused_sum_2", "reduction"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
        ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTT", "gemm"),
        ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false>>", "attention"),
        ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80", "attention"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x192", "attention"),
        ("void cudnn::fusion::compute_dot_do_o_specialized<true, 128>(void const*)", "attention"),
        ("nvjet_sm90_tst_192x192_64x3_1x2_h_bz_coopB_NTN", "gemm"),
        ("_ZN7cutlass13device_kernelIN2at4cuda6detail25enable_3x_kernel_for_sm9x", "gemm"),
        ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda", "cat/copy"),
        ("Memcpy DtoD (Device -> Device)", "cat/copy"),
        ("void at::native::indexFuncLargeIndex<float, long, unsigned int, 2, 2, -2, true>", "scatter/gather"),
        ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 2>", "cat/copy"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "pointwise"),
        ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, MeanOps>>", "reduction"),
        ("void at::native::_scatter_gather_elementwise_kernel<128, 4>", "scatter/gather"),
        ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float>", "norm"),
        ("void cub::DeviceRadixSortOnesweepKernel<...>", "sort"),
        ("aten::mm", "gemm"),
        ("aten::mul", "pointwise"),
        ("aten::index_select", "scatter/gather"),
        ("aten::cat", "cat/copy"),
        ("aten::mean", "reduction"),
        ("cudaDeviceSynchronize_nothing_known", "other"),
    ],
)
def test_classify_kernel_families(name, family):
    assert classify_kernel(name) == family


def test_profile_kernels_on_cpu_labels_host_ops_and_keeps_counts():
    a = torch.randn(64, 64)
    b = torch.randn(64, 64)

    def step():
        c = a @ b
        (c * 2 + 1).sum()
        a @ b

    table = profile_kernels(step, steps=4, device="cpu")
    assert table.activity == "cpu" and "not device kernels" in table.note
    mm = next(r for r in table.rows if r.name == "aten::mm")
    assert mm.family == "gemm" and mm.count_per_step == 2.0
    fams = {f.family for f in table.families}
    assert {"gemm", "pointwise", "reduction"} <= fams
    assert table.glue_ms_per_step < table.total_ms_per_step
    assert [r.us_per_step for r in table.rows] == sorted((r.us_per_step for r in table.rows), reverse=True)


def test_bandwidth_on_cpu_is_labelled_host_memcpy_and_follows_the_formula():
    bw = measure_bandwidth("cpu", nbytes=2**22, copies=5)
    assert bw.kind == "host_memcpy" and "not an HBM" in bw.label
    assert bw.tbs == pytest.approx(2 * 2**22 * 5 / bw.seconds / 1e12)
    assert 0 < bw.tbs < 5, bw  # a shared 2-core host can be very slow; no host copies 5 TB/s


def test_record_op_bytes_counts_real_traffic_fwd_and_bwd():
    x = torch.randn(128, 256, requires_grad=True)
    s = torch.randn(128, 1, requires_grad=True)

    ops = record_op_bytes(lambda x, s: x * s, x, s)
    fwd = [o for o in ops if o.phase == "fwd"]
    assert [o.op for o in fwd] == ["aten.mul"]
    assert fwd[0].bytes_read == 128 * 256 * 4 + 128 * 4 and fwd[0].bytes_written == 128 * 256 * 4
    bwd = [o for o in ops if o.phase == "bwd"]
    assert any(o.op == "aten.mul" for o in bwd) and any(o.op == "aten.sum" for o in bwd)
    assert sum_bytes(ops)["bwd"] > sum_bytes(ops)["fwd"]


def test_broadcast_input_counts_the_elements_it_holds():
    x = torch.randn(64, 128)
    row = torch.randn(128).expand(64, 128)
    ops = record_op_bytes(torch.add, x, row, backward=False)
    assert ops[0].bytes_read == 64 * 128 * 4 + 128 * 4


def test_gap_table_uses_boundary_bytes_and_measured_bandwidth():
    x = torch.randn(32768, 64, dtype=torch.bfloat16, requires_grad=True)
    s = torch.randn(32768, 1, dtype=torch.bfloat16, requires_grad=True)
    by = boundary_bytes(lambda x, s: x * s, x, s)
    assert by["fwd"] == 2 * 32768 * 64 * 2 + 32768 * 2
    # the phase's gap rows (one path): per step = per-call median x calls, ideal from boundary bytes
    from phases.local_compile_perf.ideal_times import build_gap_rows

    op = {"op": "scale", "region": "scale", "calls_per_step": 2, "shapes": ["(32768, 64):bfloat16"],
          "fwd_ms": [0.05, 0.04, 0.06], "fwdbwd_ms": [0.25, 0.2, 0.3], "fwd_bytes": by["fwd"], "bwd_bytes": by["bwd"],
          "eager_bytes": {"fwd": by["fwd"], "bwd": 2 * by["bwd"]}}
    (row,) = build_gap_rows([op], bandwidth_tbs=4.0)
    assert row["ideal_ms"] == pytest.approx(2 * ideal_ms(by["fwd"] + by["bwd"], 4.0))
    assert row["measured_ms"] == pytest.approx(0.5) and row["fwd_ms"] == pytest.approx(0.1)
    assert row["gap_ms"] == pytest.approx(0.5 - row["ideal_ms"])
    assert row["eager_bytes"] == 2 * (by["fwd"] + 2 * by["bwd"])


def test_count_graphs_over_token_counts_and_no_grad():
    harness = build_harness()
    harness.bind_regions(["rms_norm", "swiglu"])
    try:
        one = count_graphs(build_shape_pass(harness, tokens=[8], device="cpu", dtype=torch.float32, seed=0),
                           functions=REGIONS)
        # one graph with grad, one for the no_grad pass; its inputs are detached like an eval
        # forward's, so the first layer's leaf input costs no extra graph
        assert one.per_function == {"rms_norm": 2, "swiglu": 2} and one.unique_graphs == 4
        three = count_graphs(build_shape_pass(harness, tokens=[8, 16, 24], device="cpu", dtype=torch.float32, seed=0),
                             functions=REGIONS)
        assert three.per_function == {"rms_norm": 6, "swiglu": 6}
        assert (three.recompile_limit, three.target) == (8, 6) and three.within_target
        five = count_graphs(build_shape_pass(harness, tokens=[8, 16, 24, 32, 40], device="cpu", dtype=torch.float32,
                                             seed=0), functions=REGIONS)
        assert "FailOnRecompileLimitHit" in five.limit_hit
        assert five.worst == 8 and not five.within_limit and not five.within_target
    finally:
        harness.bind_regions([])


def test_an_input_updated_in_place_counts_as_written():
    x = torch.ones(1024, dtype=torch.int32)
    assert boundary_bytes(lambda w: w.add_(1), x)["fwd"] == 2 * 4096
    assert boundary_bytes(lambda w: w + 1, x)["fwd"] == 2 * 4096
    assert boundary_bytes(lambda w: None, x)["fwd"] == 4096
