"""The probe's routing check: HF's block and the target's own router, given HF's gate weights, route a tiny twin.

phimoe's sparsemixer is a rule Titan's router does not have (a person's call, outside the experiment
folder); laguna's sigmoid router is one the target could configure and does not (the agent's), and a
reference fix inside the experiment folder clears it. Clean models stay clean (test_moe_probe).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from phases.add_moe_model.model_source import resolve_model_source
from phases.add_moe_model.workspace import new_run_workspace
from tests import moe_reference_fixes as fixes
from tests.conftest import call_worker

pytestmark = pytest.mark.slow
PROBE = "phases.add_moe_model.work.probe:probe"


def routing_issues(answer: dict) -> dict[str, dict]:
    assert answer["error"] is None, answer
    return {i["code"]: i for i in answer["report"]["issues"] if i["code"].startswith("router_rule")}


def probe_in_process(model: str) -> dict:
    from phases.add_moe_model.work.probe import probe

    return probe({"source": resolve_model_source(model).model_dump(mode="json")})


def test_a_routing_rule_titan_does_not_have_is_a_persons_call():
    found = routing_issues(probe_in_process("type:phimoe"))
    issue = found["router_rule_unsupported"]
    assert issue["severity"] == "core" and "PhimoeSparseMoeBlock" in issue["message"]
    assert issue["fix_location"].startswith("torchtitan/models/common/moe.py")


def test_a_rule_the_target_misconfigures_is_the_agents_and_a_fix_in_the_experiment_folder_clears_it(tmp_path: Path):
    source = {"source": resolve_model_source("type:laguna").model_dump(mode="json")}
    target = new_run_workspace(tmp_path / "state")
    before = routing_issues(call_worker(PROBE, source, target=target))["router_rule_mismatch"]
    assert before["severity"] == "fixable" and "score_func=sigmoid" in before["message"], before
    assert "moe_replacement.py" in before["fix_location"]
    fixes.laguna_router(target)
    assert routing_issues(call_worker(PROBE, source, target=target)) == {}


def test_the_router_rule_is_checked_behind_leading_dense_layers(tmp_path: Path):
    """DeepSeek-V3's first three layers are dense: the tiny twin was indexed at the real MoE layer (3) and the
    checks never ran ("IndexError: index 3 is out of range", a note). A target that drops the route scale is now
    caught, with HF's rule found through the group-limited choice (8 groups of the twin's experts, 4 kept)."""
    assert_a_dropped_scale_is_caught("deepseek_v3", tmp_path)


def test_a_scale_hf_applies_after_its_experts_is_the_routers_route_scale(tmp_path: Path):
    """BEAM's router hands its experts unscaled weights and the block multiplies their output by
    routed_scaling_factor (2.5); Titan's router scales the weights. A blind agent was told to set route_scale=1
    ("routes 64 of 64 tokens differently"), which would drop the factor: the same routing is no finding, and a
    target that does drop the scale is caught, with HF's rule at 2.5."""
    assert routing_issues(probe_in_process("type:beam")) == {}
    assert_a_dropped_scale_is_caught("type:beam", tmp_path)


def assert_a_dropped_scale_is_caught(model: str, tmp_path: Path) -> None:
    """A target that drops the route scale (2.5 for both models here) is a router_rule_mismatch naming HF's."""
    source = {"source": resolve_model_source(model).model_dump(mode="json")}
    target = new_run_workspace(tmp_path / "state")
    fixes.replace_once(target, fixes.MOE, '    # Route scaling factor (DeepSeek V2/V3)\n'
                       '    route_scale = getattr(config, "routed_scaling_factor", 1.0)\n',
                       "    route_scale = 1.0  # the scale dropped\n")
    found = routing_issues(call_worker(PROBE, source, target=target))["router_rule_mismatch"]
    assert "route_scale=1.0" in found["message"] and "route_scale=2.5" in found["message"], found["message"]
