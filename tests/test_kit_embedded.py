"""The kit against the embedded DeepSeek-V3-shaped harness (small dims, CPU, real Inductor)."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT

EMBEDDED = "phases.local_compile_perf.embedded.moe_layer.harness:build_harness"


@pytest.fixture(scope="session")
def embedded_harness():
    from phases.kit.harness import load_harness

    return load_harness(EMBEDDED)


@pytest.mark.slow
def test_upstream_regions_vs_eager_and_fp64_then_measured(embedded_harness):
    import torch

    from phases.kit.correctness import check_correctness
    from phases.kit.harness import TimingKnobs
    from phases.kit.attention import attention_flops
    from phases.kit.measure_once import MeasureRequest, measure_tree

    assert embedded_harness.spec.name == "embedded:dsv3-small"  # CPU picks the small dims
    res = check_correctness(embedded_harness, candidate_tree="upstream", tokens=32, device="cpu", seed=0)
    params = embedded_harness.build(tokens=8, device="cpu", dtype=torch.float32, seed=0).layers.parameters()
    n_grads = 1 + sum(1 for _ in params)
    assert [len(c.diffs) for c in res.comparisons] == [n_grads + 1] * 4
    same_dtype = [c for c in res.comparisons if "vs fp64" not in c.label]
    assert all(c.ok for c in same_dtype), [(c.label, c.worst) for c in same_dtype]
    # a .float() inside the layers makes the "fp64" reference partly fp32: reported, not hidden
    assert isinstance(res.reference_downcasts, tuple)

    result = measure_tree(MeasureRequest(harness=EMBEDDED, tree="upstream", tokens=32, device="cpu",
                                         timing=TimingKnobs(warmup=2, iters=3, profile_steps=1),
                                         target=str(ROOT)))
    assert result.regions == ("router",) and result.spec.layer_kinds == ("dense", "moe")
    assert len(result.timing.samples_ms) == 3 and result.kernels.activity == "cpu"
    assert {f.family for f in result.kernels.families} >= {"gemm", "pointwise"}
    assert result.cuda_graph.reason == "no CUDA device"
    assert result.attention is None  # counted in the eager tree only

    eager = measure_tree(MeasureRequest(harness=EMBEDDED, tree="eager", tokens=32, device="cpu",
                                        timing=TimingKnobs(warmup=1, iters=2, profile_steps=1), target=str(ROOT)))
    cfg = embedded_harness.config
    per_layer = attention_flops((1, cfg.n_heads, 32, cfg.qk_head_dim), (1, cfg.n_heads, 32, cfg.qk_head_dim),
                                (1, cfg.n_heads, 32, cfg.v_head_dim), causal=True)
    assert eager.attention.calls == 2 and eager.attention.flops_fwd == 2 * per_layer  # one MLA per layer
    assert any("scaled_dot_product" in k for k in eager.attention.kernels), eager.attention.kernels


def test_a_lean_run_times_its_steps_and_says_it_profiled_nothing():
    """Cold-compile runs read the first call only: no profile and no CUDA-graph replay in them."""
    from phases.kit.harness import TimingKnobs
    from phases.kit.measure_once import MeasureRequest, measure_tree

    result = measure_tree(MeasureRequest(harness=EMBEDDED, tree="eager", tokens=16, device="cpu", profile=False,
                                         cuda_graph=False, timing=TimingKnobs(warmup=1, iters=2, profile_steps=1),
                                         target=str(ROOT)))
    assert len(result.timing.samples_ms) == 2 and result.timing.compile_ms is not None
    assert result.kernels.rows == () and result.kernels.steps == 0 and result.kernel_ms == 0
    assert result.not_applicable["kernel_time"] == "not profiled (a run that times its steps only)"
    assert result.cuda_graph.reason == "CUDA-graph replay not requested"
