"""The shipped router-topk rewrite picks topk's experts, bitwise, with no topk call.

The rewrite (candidates/router-topk, the skill's pattern 10) replaces the router region's three
``topk`` calls, which Inductor lowers as ATen fallbacks, with argmax rounds and a rank count.
Routing is discontinuous, so it must choose exactly what ``topk`` chooses: here on random logits of
several scales, with the model's ``[E]`` bias and with the ``[T, E]`` bias routing replay uses
(kit routing), in bf16 and fp32, eager and compiled.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys

import pytest
import torch

from phases.local_compile_perf.workspace import CANDIDATES_DIR, EMBEDDED_ROOT

KW = dict(n_groups=8, topk_groups=4, top_k=8, route_scale=2.5)


@pytest.fixture(scope="module")
def routers(tmp_path_factory):
    """(main's route_tokens, the candidate's route_tokens), each from its own copy of the library."""
    root = tmp_path_factory.mktemp("routers")
    for name, diff in (("lcp_router_main", None), ("lcp_router_topk", CANDIDATES_DIR / "router-topk" / "change.diff")):
        shutil.copytree(EMBEDDED_ROOT / "moe_layer", root / name)
        if diff:
            subprocess.run(["git", "apply", "-p3", f"--directory={name}", str(diff)], cwd=root, check=True)
    sys.path.insert(0, str(root))
    try:
        main, topk = (importlib.import_module(f"{n}.router") for n in ("lcp_router_main", "lcp_router_topk"))
    finally:
        sys.path.remove(str(root))
    body = (root / "lcp_router_topk" / "router.py").read_text().split("def route_tokens")[1].split("\ndef ")[0]
    assert ".topk(" not in body and ".topk(" in (root / "lcp_router_main" / "router.py").read_text()
    return main.route_tokens, topk.route_tokens


def draws(seed: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, 256, generator=g) * (1 + seed % 4)
    bias = 1e-2 * torch.randn(256, generator=g)
    return (logits.bfloat16() if seed % 2 else logits), bias


@pytest.mark.parametrize("seed", range(8))
def test_the_rewrite_picks_topks_experts_and_weights_bitwise_in_eager(routers, seed) -> None:
    main, topk = routers
    logits, bias = draws(seed, (1, 5, 256, 2048)[seed % 4])
    for b in (bias, bias.expand(logits.shape[0], -1).clone()):
        weights, experts = main(logits, b, **KW)
        got_weights, got_experts = topk(logits, b, **KW)
        assert torch.equal(got_experts, experts) and torch.equal(got_weights, weights)


def test_a_replayed_routing_is_chosen_in_its_recorded_order(routers) -> None:
    from phases.kit.routing import forced_bias

    main, topk = routers
    logits, bias = draws(3, 64)
    _weights, recorded = main(draws(4, 64)[0], bias, **KW)  # another routing, as the reference records one
    _weights, experts = topk(logits, forced_bias(bias, recorded), **KW)
    assert torch.equal(experts, recorded)


def test_compiled_it_picks_the_same_experts_and_grads_agree(routers) -> None:
    main, topk = routers
    logits, bias = draws(0, 512)
    compiled = torch.compile(topk, fullgraph=True)
    ref = logits.clone().requires_grad_()
    got = logits.clone().requires_grad_()
    weights, experts = main(ref, bias, **KW)
    got_weights, got_experts = compiled(got, bias, **KW)
    assert torch.equal(got_experts, experts)
    torch.testing.assert_close(got_weights, weights, rtol=1e-6, atol=0)  # Inductor's own rounding
    (weights * torch.arange(8.0)).sum().backward()
    (got_weights * torch.arange(8.0)).sum().backward()
    torch.testing.assert_close(got.grad, ref.grad, rtol=1e-5, atol=1e-7)
