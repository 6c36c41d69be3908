"""Fixability of the layout and key findings: a reference fix in the experiment folder clears each on a real run.

As in tests/test_moe_fixability.py, a run starts on the embedded torchtitan 0.3.0 workspace, the
probe's findings are seen standing, the reference fixes of tests/moe_reference_fixes_layouts.py are
applied inside the experiment folder, and one advance re-probes the fixed target (``max_phases=1``:
the findings are the probe's, a full run would add minutes for nothing more).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.trail.store import RunStore
from tests import moe_reference_fixes_layouts as layouts
from tests.test_moe_fixability import _codes, _left_the_probe_clean, _reprobe, _start

pytestmark = pytest.mark.slow


def test_afmoe_round_trip_keys_router_and_norms_clear_and_the_run_leaves_the_probe(tmp_path: Path) -> None:
    """The round trip is judged on the target's own adapter: its reverse pattern sent the block's
    ``expert_bias`` to ``gate.e_score_correction_bias``, so HF -> Titan -> HF changed the keys."""
    store = RunStore(tmp_path / "state")
    run_id, target = _start(store, "type:afmoe")
    before = store.read_state(run_id)
    assert _codes(before) == {"roundtrip_failed", "state_dict_keys_unmapped", "score_func_mismatch",
                              "module_without_sharding_config"}, before["issues"]
    roundtrip = next(i for i in before["issues"] if i["code"] == "roundtrip_failed")
    assert "mlp.gate.e_score_correction_bias" in roundtrip["message"]
    assert before["results"]["probe"]["state_dict_roundtrip"] == "FAIL"

    probe = _left_the_probe_clean(_reprobe(store, run_id, target, *layouts.AFMOE))
    assert probe["roundtrip_detail"]["max_abs_diff"] == 0.0, probe["roundtrip_detail"]
    assert (probe["score_func"], probe["route_norm"]) == ("sigmoid", True)
