"""Routing replay: the candidate routes every token as the reference did, through its own router."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch

from phases.kit.correctness import capture_fwd_bwd, compare_captures
from phases.kit.routing import find_routers, record_routing, replay_routing

EMBEDDED = "examples.moe_layer.harness:build_harness"
ROUTER = "1.ffn.router"


@pytest.fixture(scope="module")
def harness():
    from phases.kit.harness import load_harness

    return load_harness(EMBEDDED)


def build(harness, *, nudge: float = 0.0):
    workload = harness.build(tokens=64, device="cpu", dtype=torch.float32, seed=0)
    if nudge:
        gate = find_routers(workload.layers)[ROUTER].gate.weight
        with torch.no_grad():
            gate.add_(nudge * torch.randn(gate.shape, generator=torch.Generator().manual_seed(1)))
    return workload


def run(workload, replay=None):
    with replay_routing(workload.layers, replay) if replay else nullcontext(), record_routing(workload.layers) as chosen:
        captured = capture_fwd_bwd(workload)
    return captured, chosen


def test_replay_holds_the_recorded_experts_and_only_the_selection(harness):
    ref, ref_ids = run(build(harness))
    assert list(ref_ids) == [ROUTER] and ref_ids[ROUTER].shape == (64, 4)
    nudged = build(harness, nudge=0.05)
    own, own_ids = run(nudged)
    assert (own_ids[ROUTER] != ref_ids[ROUTER]).any(-1).sum() > 8, "the nudge must move some tokens"
    bias = find_routers(nudged.layers)[ROUTER].correction_bias.clone()
    replayed, ids = run(nudged, replay=ref_ids)
    assert ids[ROUTER].equal(ref_ids[ROUTER])
    assert find_routers(nudged.layers)[ROUTER].correction_bias.equal(bias), "the bias is restored"
    # the weights still come from the nudged gate's own scores, so grads still differ, but by
    # much less than with the nudged model's own choice of experts
    with_replay = {d.name: d.rel_l2 for d in compare_captures(replayed, ref, label="replayed").diffs}
    without = {d.name: d.rel_l2 for d in compare_captures(own, ref, label="own routing").diffs}
    assert 0 < with_replay["grad:1.ffn.experts.w13"] < without["grad:1.ffn.experts.w13"] / 2, (with_replay, without)


def test_a_replay_that_does_not_take_or_names_no_router_raises(harness):
    workload = build(harness)
    _, ids = run(workload)
    with pytest.raises(ValueError, match="no router named"):
        run(workload, replay={"9.ffn.router": ids[ROUTER]})
    impossible = ids[ROUTER].clone()
    impossible[0] = torch.arange(4) * 4  # one expert from each of the 4 groups; only 2 groups are kept
    with pytest.raises(RuntimeError, match="chose other experts than recorded for 1 token"):
        run(workload, replay={ROUTER: impossible})
    assert find_routers(workload.layers)[ROUTER].correction_bias.shape == (16,), "restored after a failure"
