"""The embedded DeepSeek-V3 layer library: regions, routing, experts, harness, candidates."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from examples.moe_layer import local_compile as lc  # noqa: E402
from examples.moe_layer.config import DSV3_REAL, dsv3_config  # noqa: E402
from examples.moe_layer.experts import GroupedExperts, resolve_expert_backend  # noqa: E402
from examples.moe_layer.harness import build_harness  # noqa: E402
from examples.moe_layer.moe import combine_tokens, dispatch_tokens  # noqa: E402
from examples.moe_layer.router import route_tokens  # noqa: E402
from phases.kit.harness import load_harness  # noqa: E402
from phases.local_compile_perf.workspace import load_candidates, materialize_embedded_workspace  # noqa: E402


@pytest.fixture(scope="session")
def harness():
    return build_harness(scale="small")


@pytest.fixture(autouse=True)
def eager_regions():
    lc.apply_local_compile([])
    yield
    lc.apply_local_compile([])


def test_real_dims_are_deepseek_v3():
    c = DSV3_REAL
    assert (c.dim, c.q_lora_rank, c.kv_lora_rank, c.n_heads) == (7168, 1536, 512, 128)
    assert (c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim) == (128, 64, 128)
    assert (c.n_routed_experts, c.moe_inter_dim, c.inter_dim, c.top_k) == (256, 2048, 18432, 8)
    assert (c.n_groups, c.topk_groups, c.n_shared_experts, c.route_scale) == (8, 4, 1, 2.5)
    assert c.n_local_experts == 32  # EP8 share on one GPU


def test_config_lists_every_problem():
    with pytest.raises(ValueError, match="ep_degree 3.*n_groups 5"):
        import dataclasses

        dataclasses.replace(dsv3_config("small"), ep_degree=3, n_groups=5)


def test_region_contract_errors():
    with pytest.raises(ValueError, match="fullgraph"):
        lc.local_compile("x", fullgraph=False)
    with pytest.raises(ValueError, match="already registered"):
        lc.local_compile("router")(lambda x: x)
    with pytest.raises(ValueError, match=r"unknown region\(s\) \['nope'\]; registered: \['rms_norm', 'rope'"):
        lc.apply_local_compile(["router", "nope"])
    assert lc.enabled_regions() == ()
    with pytest.raises(ValueError, match="not batch_invariant"):
        lc.apply_local_compile(["router"], batch_invariant_mode=True)


def test_harness_spec_and_load(harness):
    assert harness.spec.name == "embedded:dsv3-small"
    assert harness.spec.upstream_regions == ("router",)
    assert set(harness.spec.upstream_regions) < set(harness.spec.all_regions)
    assert harness.spec.layer_kinds == ("dense", "moe")
    loaded = load_harness("examples.moe_layer.harness:build_harness")
    assert loaded.spec.all_regions == harness.spec.all_regions
    with pytest.raises(ValueError, match="pkg.module:factory"):
        load_harness("examples.moe_layer.harness")


def test_router_picks_within_kept_groups():
    c = dsv3_config("small")
    torch.manual_seed(0)
    logits = torch.randn(64, c.n_routed_experts)
    bias = 0.1 * torch.randn(c.n_routed_experts)
    weights, experts = route_tokens(
        logits, bias, n_groups=c.n_groups, topk_groups=c.topk_groups, top_k=c.top_k, route_scale=c.route_scale
    )
    per_group = c.n_routed_experts // c.n_groups
    for row in experts:
        assert len(set((row // per_group).tolist())) <= c.topk_groups
    torch.testing.assert_close(weights.sum(-1), torch.full((64,), c.route_scale))
    expected = logits.sigmoid().gather(1, experts)
    torch.testing.assert_close(weights, expected / expected.sum(-1, keepdim=True) * c.route_scale)


def test_dispatch_combine_matches_per_token_loop():
    torch.manual_seed(0)
    tokens, dim, n_local, top_k = 12, 8, 4, 3
    x = torch.randn(tokens, dim)
    experts = torch.randint(0, 16, (tokens, top_k))
    weights = torch.rand(tokens, top_k)
    rows, counts, row_weights, token_index = dispatch_tokens(x, experts, weights, n_local=n_local)
    assert counts.tolist() == torch.bincount((experts % n_local).flatten(), minlength=n_local).tolist()
    out = combine_tokens(rows * row_weights.unsqueeze(-1), token_index, tokens=tokens)
    torch.testing.assert_close(out, x * weights.sum(-1, keepdim=True))


def test_off_cpu_only_references_may_take_the_per_expert_loop(monkeypatch):
    """CUDA's grouped GEMM is bf16-only: fp32/fp64 captures take the loop, a bf16 model must not."""
    from examples.moe_layer import experts

    monkeypatch.setattr(experts, "probe_grouped_mm", lambda device, dtype: False)
    cuda = torch.device("cuda")
    assert resolve_expert_backend(cuda, torch.float32) == "per_expert_loop"
    assert resolve_expert_backend(cuda, torch.float64) == "per_expert_loop"
    with pytest.raises(RuntimeError, match="cannot run fwd\\+bwd on cuda in torch.bfloat16"):
        resolve_expert_backend(cuda, torch.bfloat16)


def test_grouped_mm_matches_per_expert_loop():
    device, dtype = torch.device("cpu"), torch.bfloat16
    assert resolve_expert_backend(device, dtype) == "grouped_mm"
    assert resolve_expert_backend(device, torch.float32) == "per_expert_loop"  # CPU fp32 bwd fails in 2.13
    torch.manual_seed(0)
    grouped = GroupedExperts(n_experts=4, dim=32, inter_dim=16, backend="grouped_mm", device=device, dtype=dtype)
    loop = GroupedExperts(n_experts=4, dim=32, inter_dim=16, backend="per_expert_loop", device=device, dtype=dtype)
    loop.load_state_dict(grouped.state_dict())
    x = torch.randn(20, 32, dtype=dtype)
    counts = torch.tensor([5, 0, 9, 6])
    weights = torch.rand(20)
    torch.testing.assert_close(grouped(x, counts, weights), loop(x, counts, weights), atol=2e-2, rtol=2e-2)


def test_workload_step_is_seeded_and_grads_flow(harness):
    workload = harness.build(tokens=64, device="cpu", dtype=torch.bfloat16, seed=0)
    assert workload.expert_backend == "grouped_mm"
    (x,) = workload.inputs
    assert x.is_leaf and x.requires_grad and x.shape == (64, 256)
    first = workload.step()
    assert torch.equal(first, workload.step())
    assert x.grad is not None and all(p.grad is not None for p in workload.layers.parameters())


@pytest.mark.slow
def test_router_region_compiles_and_matches_eager(harness):
    """Upstream tree: the router region under Inductor vs eager, same inputs (bf16 tolerance)."""
    workload = harness.build(tokens=128, device="cpu", dtype=torch.bfloat16, seed=0)
    router = workload.layers[1].ffn.router
    h = workload.inputs[0].detach()
    with torch.no_grad():
        eager_w, eager_e = router(h)
        harness.bind_regions(["router"])
        assert lc.enabled_regions() == ("router",)
        compiled_w, compiled_e = router(h)
    assert torch.equal(eager_e.sort(-1).values, compiled_e.sort(-1).values)
    order_e, order_c = eager_e.argsort(-1), compiled_e.argsort(-1)
    torch.testing.assert_close(eager_w.gather(1, order_e), compiled_w.gather(1, order_c), atol=1e-2, rtol=8e-3)


CANDIDATE_SCRIPT = r"""
import json, sys, torch
from examples.moe_layer import harness as H, local_compile as LC
assert H.__file__.startswith(sys.argv[1]), H.__file__
regions = json.loads(sys.argv[2])
h = H.build_harness(scale="small")
def run():
    w = h.build(tokens=64, device="cpu", dtype=torch.float32, seed=0)
    loss = w.step()
    grads = [p.grad.clone() for p in w.layers.parameters()] + [w.inputs[0].grad.clone()]
    return loss, grads
h.bind_regions([])
eager = run()
for name in regions:
    LC._REGIONS[name].compile_kwargs = {"backend": "aot_eager"}
h.bind_regions(regions)
assert LC.enabled_regions() == tuple(sorted(regions)), LC.enabled_regions()
traced = run()
torch.save({"eager": eager, "traced": traced, "regions": list(h.spec.all_regions)}, sys.argv[3])
"""


def rel_l2(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.mark.slow
def test_candidates_are_faithful_and_trace_fullgraph(tmp_path):
    """Each candidate branch in a fresh process (fp32): same loss and grads as main, and its
    regions trace with fullgraph=True (aot_eager backend: Dynamo + AOTAutograd, no Inductor)."""
    ws = materialize_embedded_workspace(tmp_path / "state")
    runs = {}
    for branch, regions in [("main", [])] + [(c.meta.branch, list(c.meta.regions)) for c in load_candidates()]:
        tree = tmp_path / branch.replace("/", "-")
        subprocess.run(["git", "-C", str(ws), "worktree", "add", "-q", "--detach", str(tree), branch], check=True)
        out = tmp_path / f"{tree.name}.pt"
        proc = subprocess.run([sys.executable, "-c", CANDIDATE_SCRIPT, str(tree), json.dumps(regions), str(out)],
                              cwd=tree, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[branch] = (regions, torch.load(out))
    main_loss, main_grads = runs["main"][1]["eager"]
    assert "mla_qk" in runs["candidate/norm-rope-cat"][1]["regions"]
    for branch, (regions, result) in runs.items():
        for label in ("eager", "traced"):
            loss, grads = result[label]
            torch.testing.assert_close(loss, main_loss, rtol=1e-5, atol=0, msg=f"{branch} {label}")
            worst = max(rel_l2(g, m) for g, m in zip(grads, main_grads))
            assert worst < 1e-4, f"{branch} {label}: grads differ from main by rel L2 {worst:.3g}"
