"""Best-known kernels beside the glue ops (the skill's step 2): timed where they can run, a reason where not.

On this CPU machine the Liger kernels cannot run (Triton, CUDA only), so the CPU tests check the
reasons, the same-op check that guards every best-known time, and how a measured kernel reaches
the reports. The CUDA test runs each kernel on the embedded harness's own op arguments.
"""

from __future__ import annotations

import pytest
import torch

from phases.local_compile_perf.embedded.moe_layer.norm import rms_norm
from phases.local_compile_perf.work.best_known import (
    KERNELS, MATCH_RTOL, measure_best_known, output_diffs, package_version, why_not_runnable,
)


def _no_grad_step(fn):
    return None


def test_every_region_of_the_embedded_harness_has_a_kernel_or_a_reason() -> None:
    for region in ("rms_norm", "swiglu", "rope"):
        assert why_not_runnable(region, device="cpu").startswith(f"{KERNELS[region].name} is a Triton kernel")
    assert "group-limited top-k" in why_not_runnable("router", device="cuda")
    assert "no best-known kernel" in why_not_runnable("made_up", device="cuda")
    if package_version("liger-kernel") is None:
        assert why_not_runnable("rms_norm", device="cuda") == ("liger-kernel is not installed on this machine "
                                                                "(pip install liger-kernel)")


def test_a_kernel_that_cannot_run_here_records_why_and_no_time() -> None:
    x, w = torch.randn(4, 8), torch.ones(8)
    best = measure_best_known("rms_norm", rms_norm, (x, w, 1e-6), {}, device="cpu", warmup=1, iters=1,
                              grad_step=_no_grad_step)
    assert best.fwdbwd_ms == () and best.device_ms is None and "CUDA only" in best.reason


def test_the_same_op_check_sees_outputs_and_grads() -> None:
    """A kernel whose forward matches but whose backward differs is not the same op."""
    x = torch.randn(16, 32, requires_grad=True)
    w = torch.randn(32, requires_grad=True)

    class WrongGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, eps):
            return rms_norm(x, w, eps)

        @staticmethod
        def backward(ctx, grad):
            return torch.zeros(16, 32), torch.zeros(32), None

    assert output_diffs(rms_norm, rms_norm, (x, w, 1e-6), {}) == (0.0, 0.0)
    absolute, relative = output_diffs(rms_norm, WrongGrad.apply, (x, w, 1e-6), {})
    assert relative == pytest.approx(1.0) and absolute > 0  # the grads are all wrong: 100% of their largest value


def test_a_faster_best_known_kernel_is_offered_and_shown_in_the_reports() -> None:
    from phases.local_compile_perf.ideal_times import build_gap_rows
    from phases.local_compile_perf.pick_fix import best_known_offers
    from phases.local_compile_perf.results import GlueRow
    from phases.local_compile_perf.stack_code import judge_op

    best = {"kernel": "liger_kernel.ops.rms_norm.LigerRMSNormFunction", "source": "liger-kernel 0.8.5",
            "fwdbwd_ms": [0.1, 0.2, 0.3], "device_ms": 0.05, "max_abs_diff": 0.01, "max_rel_diff": 0.002,
            "note": "", "reason": ""}
    op = {"op": "rms_norm", "region": "rms_norm", "calls_per_step": 3, "shapes": ["(8, 4):bfloat16"],
          "fwd_ms": [0.3], "fwdbwd_ms": [0.5, 0.5, 0.5], "fwd_bytes": 1000, "bwd_bytes": 2000,
          "eager_bytes": {"fwd": 3000, "bwd": 6000}, "compiled": True, "device_ms": 0.4, "best_known": best}
    (row,) = build_gap_rows([op], bandwidth_tbs=1.0)
    assert row["best_known_ms"] == pytest.approx(0.6) and row["measured_ms"] == pytest.approx(1.5)
    assert row["best_known"].startswith("LigerRMSNormFunction (liger-kernel 0.8.5")
    (offer,) = best_known_offers([GlueRow.model_validate(row)])
    assert offer.startswith("rms_norm: LigerRMSNormFunction") and "0.6000 ms/step against 1.5000" in offer
    judged = judge_op(op, 1.0, [], floor_ms=None)
    assert judged["best_known_ms"] == pytest.approx(0.15)  # the device time, as the op's own
    assert "a candidate the workflow can take" in judged["best_known_beats"]
    slower = judge_op({**op, "device_ms": 0.01}, 1.0, [], floor_ms=None)
    assert slower["best_known_beats"] is None
    missing = judge_op({**op, "best_known": {**best, "fwdbwd_ms": [], "reason": "no CUDA"}}, 1.0, [], floor_ms=None)
    assert missing["best_known_ms"] is None and missing["best_known"] == "no CUDA"


@pytest.mark.skipif(not torch.cuda.is_available() or package_version("liger-kernel") is None,
                    reason="Liger's kernels need CUDA and the liger-kernel package")
def test_liger_kernels_match_and_time_on_the_harness_ops() -> None:
    from phases.local_compile_perf.embedded.moe_layer.harness import build_harness
    from phases.kit.graphs import find_region_slots
    from phases.local_compile_perf.work.glue import _grad_step, record_region_calls

    harness = build_harness(scale="small")
    harness.bind_regions([])
    workload = harness.build(tokens=256, device="cuda", dtype=torch.bfloat16, seed=0)
    slots = find_region_slots()
    calls = record_region_calls(slots, workload.forward)
    seen = set()
    for (region, _shapes), entry in calls.items():
        if region not in KERNELS:
            continue
        best = measure_best_known(region, slots[region].fn, entry["args"], entry["kwargs"], device="cuda",
                                  warmup=2, iters=3, grad_step=_grad_step)
        assert not best.reason, best.reason
        assert best.max_rel_diff <= MATCH_RTOL and len(best.fwdbwd_ms) == 3 and best.device_ms > 0, best
        seen.add(region)
    assert seen == set(KERNELS)


def test_not_tested_lists_what_this_hardware_cannot_show() -> None:
    from phases.local_compile_perf.findings import NOT_TESTED_CUDA, NOT_TESTED_HOST, not_tested

    cpu = ("liger_kernel.ops.swiglu.LigerSiLUMulFunction is a Triton kernel: it runs on CUDA only, and this run's "
           "device is cpu")
    missing = "liger_kernel.ops.swiglu.LigerSiLUMulFunction runs on CUDA only: liger-kernel is not installed"
    ops = [{"best_known_ms": None, "best_known": cpu}, {"best_known_ms": 0.2, "best_known": "LigerRMSNormFunction"},
           {"best_known_ms": None, "best_known": "no best-known kernel: none for the router"}]
    floor = ({"tokens": 16},)  # the eager step's attention was checked against its floor
    # a host run: the fixed host list says the GPU kernels are CUDA only, once, and nothing names the H200
    assert not_tested({"ops": ops}, floor, cuda=False) == NOT_TESTED_HOST
    assert not any("H200" in n or "PP" in n for n in NOT_TESTED_HOST)
    assert NOT_TESTED_HOST[0].startswith("CUDA-graph replay, peak device memory and device kernel times")
    on_cuda = not_tested({"ops": [{"best_known_ms": None, "best_known": missing}]}, floor, cuda=True)
    assert on_cuda == (*NOT_TESTED_CUDA, f"best-known kernel: {missing}")
    assert all(" needs " in n or "no wheel" in n for n in NOT_TESTED_CUDA), "each item says why this hardware cannot"
    overrides = not_tested(None, floor, ("moe_fused",), cuda=True)
    assert overrides[-1].startswith("the target's own fused overrides (moe_fused)") and len(overrides) == 3
    assert not_tested(None, cuda=False)[-1].startswith("attention against its FLOP floor: the eager step made no")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the glue timer's device profile needs CUDA")
def test_the_glue_timer_splits_an_ops_gemm_kernels_from_its_glue() -> None:
    from types import SimpleNamespace

    from phases.local_compile_perf.work.glue import measure_glue_op

    def project_then_gate(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.silu(x @ w) * x

    x = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    op = measure_glue_op("gate", "gate", {"args": (x, w), "kwargs": {}, "calls": 1},
                         SimpleNamespace(fn=project_then_gate, compiled=None), device="cuda", warmup=2, iters=3)
    assert op.gemm_flops > 0 and 0 < op.device_glue_ms < op.device_ms, op
