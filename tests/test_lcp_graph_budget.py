"""A graph-budget rejection names the region, the guard Dynamo recompiled on, and a region named but untouched
(blind trial of 2026-12-05: 'recompile limit hit: FailOnRecompileLimitHit: Hard failure due to fullgraph=True'
named neither, and blamed the rewrite for a region it never changed)."""

from __future__ import annotations

import torch

from phases.kit.graphs import count_graphs
from phases.local_compile_perf.graph_budget import budget_breach


def test_count_graphs_keeps_the_guard_each_region_recompiled_on() -> None:
    @torch.compile(fullgraph=True)
    def scale(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * w

    def all_shapes() -> None:
        for width in (4, 8, 16):
            scale(torch.randn(2, width), torch.nn.Parameter(torch.randn(width)))

    count = count_graphs(all_shapes, functions={"scale": scale._torchdynamo_orig_callable})
    assert count.per_function == {"scale": 3}
    assert "tensor 'w' size mismatch at index 0" in count.recompile_reasons["scale"]


def numbers(per: dict[str, int], *, limit_hit: str = "", reasons: dict[str, str] | None = None) -> dict:
    return {"per_region": per, "limit": 8, "target": 6, "limit_hit": limit_hit,
            "recompile_reasons": reasons or {}}


def test_the_breach_names_the_region_its_guard_and_that_the_submission_named_it_untouched() -> None:
    hit = numbers({"rms_norm": 8, "router": 2, "weighted_combine": 2},
                  limit_hit="FailOnRecompileLimitHit: Hard failure due to fullgraph=True",
                  reasons={"rms_norm": "0/7: tensor 'x' size mismatch at index 1. expected 64, actual 32"})
    reason = budget_breach(hit, untouched={"rms_norm": "examples/moe_layer/norm.py"})
    assert reason.startswith("recompile limit hit by rms_norm: FailOnRecompileLimitHit")
    assert "rms_norm recompiled last on: 0/7: tensor 'x' size mismatch at index 1" in reason
    assert "rms_norm is named by the submission and declared in examples/moe_layer/norm.py" in reason
    over = budget_breach(numbers({"rope": 8, "swiglu": 4}), untouched={})
    assert over == "graphs per region over the headroom target 6 of 8: rope 8"
    assert budget_breach(numbers({"rope": 6}), untouched={}) == ""
