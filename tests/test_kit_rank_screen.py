"""Ranking, stop rule and the in-process screen (rotation, all samples)."""

from __future__ import annotations

import time

import pytest

from phases.kit.rank import evaluate_stop_rule, rank_candidates
from phases.kit.records import RankItem
from phases.kit.screen import rotated_orders, screen_variants


def _cand(name: str, measured: float, ideal: float, **flags: bool) -> RankItem:
    return RankItem(name=name, measured_ms=measured, ideal_ms=ideal, layer_ms=100.0, **flags)


def test_small_gap_on_a_big_share_beats_big_gap_on_a_small_share():
    # a 3x gap on 1.5% of the layer vs 1.3x on 15%
    ranked = rank_candidates([_cand("tiny_3x", 1.5, 0.5), _cand("big_1p3x", 15.0, 15.0 / 1.3)])
    assert [r.candidate.name for r in ranked] == ["big_1p3x", "tiny_3x"]
    big = ranked[0]
    assert big.share_of_layer == pytest.approx(0.15)
    assert big.score_ms == pytest.approx((15.0 - 15.0 / 1.3) * 0.15)


def test_items_under_one_percent_are_dropped_unless_flagged():
    rows = [
        _cand("noise", 0.8, 0.3),
        _cand("sync", 0.5, 0.4, removes_host_sync=True),
        _cand("wrong", 0.3, 0.3, fixes_correctness=True),
        _cand("real", 10.0, 4.0),
    ]
    ranked = rank_candidates(rows)
    assert [r.candidate.name for r in ranked] == ["real", "sync", "wrong"]
    assert {r.candidate.name: r.kept_because for r in ranked} == {
        "real": "", "sync": "removes a host sync", "wrong": "fixes correctness"}


def test_stop_rule():
    go = evaluate_stop_rule(rank_candidates([_cand("real", 10.0, 4.0)]), layer_ms=100.0)
    assert not go.stop and go.top.candidate.name == "real" and "6.000 ms" in go.reason
    done = evaluate_stop_rule(rank_candidates([_cand("noise", 0.8, 0.3)]), layer_ms=100.0)
    assert done.stop and done.top is None
    must = evaluate_stop_rule(rank_candidates([_cand("sync", 0.5, 0.4, removes_host_sync=True)]), layer_ms=100.0)
    assert not must.stop and "host sync" in must.reason


def test_rank_rejects_a_missing_layer_time():
    with pytest.raises(ValueError, match="'x' has layer_ms=0.0"):
        rank_candidates([RankItem(name="x", measured_ms=1.0, ideal_ms=0.5, layer_ms=0.0)])


def test_screen_rotates_order_and_keeps_all_samples():
    log: list[str] = []

    def variant(name: str, seconds: float):
        def step():
            log.append(name)
            time.sleep(seconds)
        return step

    res = screen_variants({"a": variant("a", 0.012), "b": variant("b", 0.002), "c": variant("c", 0.006)},
                          rounds=3, warmup=1, iters=4, device="cpu")
    assert res.orders == (("a", "b", "c"), ("b", "c", "a"), ("c", "a", "b"))
    assert {k: len(v) for k, v in res.samples_ms.items()} == {"a": 12, "b": 12, "c": 12}
    med = res.medians()
    assert med["b"] < med["c"] < med["a"], med
    assert res.timer == "host"
    # first-call (compile) per variant, then per round: warmup + iters, in the rotated order
    assert log[:3] == ["a", "b", "c"] and log[3:8] == ["a"] * 5 and log[18:23] == ["b"] * 5


def test_rotated_orders_cover_every_position():
    orders = rotated_orders(["x", "y"], 4)
    assert orders == (("x", "y"), ("y", "x"), ("x", "y"), ("y", "x"))
