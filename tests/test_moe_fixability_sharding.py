"""Fixability of the sharding findings: a reference fix in the experiment folder clears each one on a real run.

As in tests/test_moe_fixability.py, a run starts on the embedded torchtitan 0.3.0 workspace, the
probe's finding is seen standing, the reference fix of tests/moe_reference_fixes_sharding.py is
applied inside the experiment folder, and one advance re-probes the fixed target and leaves the
probe (``max_phases=1``: the finding is the probe's, a full run would add minutes for nothing more).
The two other sharding codes are proven there (Hunyuan's per-head layernorms, MiMo's sinks).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.trail.store import RunStore
from tests import moe_reference_fixes_sharding as sharding_fixes
from tests.conftest import call_worker
from tests.test_moe_fixability import _left_the_probe_clean, _reprobe, _standing

pytestmark = pytest.mark.slow
BUILD_CHECK = "phases.add_moe_model.work.build_check:build_check"
# Four layers: Qwen3-Next's default layer_types make layers 0-2 linear attention and layer 3 full attention.
TINY_QWEN3_NEXT = dict(num_hidden_layers=4, hidden_size=256, intermediate_size=256, num_experts=8,
                       num_experts_per_tok=2, moe_intermediate_size=128, shared_expert_intermediate_size=128,
                       vocab_size=1024)


def test_qwen3_next_linear_attention_layers_are_configured_and_the_run_leaves_the_probe(tmp_path: Path) -> None:
    """The finding is the target's own ``_set_layer_sharding_configs`` raising on a layer without self_attn."""
    store = RunStore(tmp_path / "state")
    run_id, target = _standing(store, "type:qwen3_next", "attention_projection_unhandled",
                               "at linear_attn (Qwen3NextGatedDeltaNet), not self_attn")

    probe = _left_the_probe_clean(_reprobe(store, run_id, target, sharding_fixes.linear_attention_layers))
    assert probe["attention"] == "hybrid"
    assert [k["name"] for k in probe["layer_kinds"]] == ["linear (linear_attention) x moe",
                                                         "gqa (full_attention) x moe"]
    assert all(k["findings"] == [] for k in probe["layer_kinds"])

    # The probe ran the target's per-layer sharding setup on both kinds (TP off). The fixed target's own
    # sharding steps on a model with both mixers, under TP 2 as well: every module configured, the states placed.
    out = call_worker(BUILD_CHECK, {"model_type": "qwen3_next", "config_kwargs": TINY_QWEN3_NEXT,
                                    "world_sizes": [4]}, target=target)
    (row,) = out["results"]
    assert out["versions"]["torchtitan_path"].startswith(str(target))
    assert (row["tp"], row["status"], row["unsharded_modules"]) == (2, "PASS", []), row
    assert row["parallelize"] == "PASS", row["parallelize_error"]
