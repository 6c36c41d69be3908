"""Fixability of the numerics findings: each agent-bound code clears under a reference fix in the experiment folder.

One real run on the embedded torchtitan 0.3.0 workspace (Qwen3-30B-A3B, clean on 0.3.0) carries them all, to keep
CI's cost at one start: the first bug is in the experiment folder before the run starts, and the probe's semantic
checks catch it on their 8-expert twin; fixed, it is left again after the probe and numerics finds it; each later
one is the agent's next edit while the run waits at numerics (as in the agent's loop, the probe does not run
again). Each step applies the reference fix of the standing finding and leaves the next bug
(tests/moe_reference_fixes_numerics.py), advances only the numerics phase (``max_phases=1``), and sees the old
finding gone and exactly the new one standing, naming the file the fix changes. After the last fix the run leaves
numerics. The declared contract (phases/add_moe_model/fixability_numerics.py) names this test for these codes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import engine
from orchestrator.trail.store import RunStore
from phases.add_moe_model.survey.runner import warm_worker
from phases.add_moe_model.workspace import EXP
from tests import moe_reference_fixes_numerics as slips

pytestmark = pytest.mark.slow
OPTIONS = {"model": "Qwen/Qwen3-30B-A3B", "branch": "current", "commit": "never", "unrun_rows": "accept",
           "device": "cpu"}
# Forked from one warm import (as the survey runs its calls): torch, transformers and torchtitan core, never the
# experiment folder, so every call imports the folder as it stands after the last edit (an edited file that the
# server had imported would send the call to a fresh process anyway).
CORE_ONLY = ("phases.add_moe_model.work", "torch", "transformers", "torchtitan", "torchtitan.models.common.moe",
             "torchtitan.models.common.attention", "torchtitan.protocols.model_spec", "torchtitan.components.optimizer",
             "torchtitan.distributed.parallel_dims", "transformers.models.qwen3_moe.modeling_qwen3_moe",
             "phases.add_moe_model.work.numerics", "phases.add_moe_model.work.probe")


def _waits_at_numerics_on(state: dict, slip: slips.Slip, *also: str) -> None:
    """The run waits for the agent at numerics on ``slip``'s code (and ``also``), each naming the file it changed."""
    assert state["phase"] == "numerics" and state["awaiting"] == "agent", state["summary"]
    by_code = {i["code"]: i for i in state["issues"]}
    assert set(by_code) == {slip.code, *also}, state["issues"]
    for issue in by_code.values():
        named = issue["fix_location"].split(" ", 1)[0]
        assert slip.path.endswith(named.removeprefix(EXP)), (slip.path, issue["fix_location"])


def test_qwen3_numerics_findings_clear_one_by_one_under_reference_fixes_and_the_run_moves_on(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "state")
    run_id = engine.start("add-moe-model", OPTIONS, store=store).run_id
    target = Path(store.read_state(run_id)["target"])
    slips.TOP_K_BY_EXPERT_COUNT.leave(target)
    with warm_worker(target, say=print, preload=CORE_ONLY):
        _clear_one_by_one(store, run_id, target)


def _clear_one_by_one(store: RunStore, run_id: str, target: Path) -> None:
    # The probe's semantic checks call the target's _probe_hf_moe_block on a tiny twin of 8 experts, so the slip
    # left before the run is the probe's finding now (it was a note beside "compatible, no issues" before issue 37).
    caught = engine.advance(run_id, store=store, max_phases=2).state
    (issue,) = caught["issues"]
    assert (caught["phase"], issue["code"]) == ("probe", "semantic_checks_not_run"), caught["issues"]
    assert "moe_replacement.py" in issue["fix_location"] and "KeyError" in issue["message"]
    slips.TOP_K_BY_EXPERT_COUNT.fix(target)
    engine.advance(run_id, store=store, max_phases=2)  # the probe and the synthetic entry on the clean folder
    slips.TOP_K_BY_EXPERT_COUNT.leave(target)  # the agent's later edit, which numerics finds
    state = engine.advance(run_id, store=store, max_phases=1).state
    probe = state["results"]["probe"]
    assert not probe["issues"] and probe["strict_load"] == "PASS", probe["issues"]
    _waits_at_numerics_on(state, slips.TOP_K_BY_EXPERT_COUNT)
    assert "KeyError" in state["issues"][0]["message"]

    steps = [(slips.TOP_K_BY_EXPERT_COUNT, slips.EXPERT_COUNT_GUARD, ()),
             (slips.EXPERT_COUNT_GUARD, slips.DOWN_TRANSPOSED, ("state_dict_roundtrip_failed",)),
             (slips.DOWN_TRANSPOSED, slips.ROUTER_KEY_MISNAMED, ())]
    for standing, following, also in steps:
        standing.fix(target)
        following.leave(target)
        _waits_at_numerics_on(engine.advance(run_id, store=store, max_phases=1).state, following, *also)

    slips.ROUTER_KEY_MISNAMED.fix(target)
    moved = engine.advance(run_id, store=store, max_phases=1).state
    numerics = moved["results"]["numerics"]
    assert not numerics.get("issues"), numerics.get("issues")
    assert numerics["verdict"]["roundtrip"]["status"] == "PASS" and numerics["verdict"]["status"] in ("PASS", "WARN")
    assert moved["phase"] not in ("probe", "numerics"), moved["summary"]
