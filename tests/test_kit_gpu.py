"""CUDA paths of the kit: event timing, CUDA-graph replay, kernel families, HBM bandwidth, peak memory.

These run only where a CUDA device exists (skipped on the CPU CI host, which the skip
reason says); the CPU paths are covered by the other test_kit_* files.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from phases.kit.bandwidth import measure_bandwidth
from phases.kit.cudagraph import measure_cuda_graph_replay
from phases.kit.profile import profile_kernels
from phases.kit.records import PeakMemory, Timing
from phases.kit.timing import measure_step

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this host")

MIN_H200_TBS = 4.0
"""H200 HBM3e copies reach well above this (spec 4.8 TB/s); lower means a broken probe."""


@pytest.fixture(scope="module")
def mlp_step():
    torch.manual_seed(0)
    layers = nn.Sequential(*[nn.Linear(1024, 1024, device="cuda", dtype=torch.bfloat16) for _ in range(4)])
    x = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def step():
        for p in layers.parameters():
            p.grad = None
        x.grad = None
        loss = torch.nn.functional.silu(layers(x)).float().square().mean()
        loss.backward()
        return loss.detach()

    return step


def test_cuda_event_timing_and_peak_memory(mlp_step):
    t = measure_step(mlp_step, warmup=5, iters=20, device="cuda")
    assert t.timer == "cuda_events" and len(t.samples_ms) == 20 and all(s > 0 for s in t.samples_ms)
    assert isinstance(t.peak_memory, PeakMemory)
    assert t.peak_memory.bytes >= 2048 * 1024 * 2 * 4  # at least the saved activations


def test_cuda_graph_replay_runs_and_drops_host_time(mlp_step):
    eager = measure_step(mlp_step, warmup=5, iters=20, device="cuda")
    replay = measure_cuda_graph_replay(mlp_step, warmup=3, iters=20, device="cuda")
    assert isinstance(replay, Timing), replay
    assert replay.timer == "cuda_graph_replay" and len(replay.samples_ms) == 20
    assert replay.median_ms <= eager.median_ms * 1.05, (replay.median_ms, eager.median_ms)


def test_profile_families_on_cuda(mlp_step):
    table = profile_kernels(mlp_step, steps=5, device="cuda")
    assert table.activity == "cuda" and "device kernels" in table.note
    fams = {f.family: f for f in table.families}
    assert "gemm" in fams and fams["gemm"].count_per_step >= 12  # 4 fwd + 8 bwd GEMMs
    assert "pointwise" in fams
    other = [r.name for r in table.rows if r.family == "other"]
    print("unclassified kernels:", other)


def test_profile_names_inductor_kernels():
    def glue(x, w):
        return torch.nn.functional.silu(x) * w + x.square().mean(-1, keepdim=True)

    fn = torch.compile(glue)
    x = torch.randn(4096, 1024, device="cuda")
    w = torch.randn(1024, device="cuda")
    fn(x, w)
    table = profile_kernels(lambda: fn(x, w), steps=3, device="cuda")
    triton = [r for r in table.rows if r.name.startswith("triton_")]
    assert triton and all(r.family in ("pointwise", "reduction") for r in triton), [r.name for r in table.rows]


def test_hbm_bandwidth():
    bw = measure_bandwidth("cuda")
    assert bw.kind == "hbm" and bw.nbytes == 2**30 and bw.copies == 20
    print(f"HBM copy bandwidth: {bw.tbs:.2f} TB/s on {bw.label}")
    assert bw.tbs >= MIN_H200_TBS or "H200" not in bw.label, bw
