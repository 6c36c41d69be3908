"""A new user's run on CPU with the defaults: the plan sizes it for the host and says why.

Issue 16 tried it as a new user would: ``start local-compile-perf --target embedded`` then
``advance`` on a 2-core host, and after 25 minutes it was still in its first eager baseline
(the skill's 2k/4k/16k tokens x 5/20/5 steps) with no sign of how long it would take. On a
CPU the defaults are now sized for the host and the plan says which and why (plan .. rank at
these sizes measured on the 2-core dev host: see docs/local-compile-perf.md). That the long
phases report each fresh process with an ETA is checked on the end-to-end run
(tests/test_lcp_workflow_e2e.py), which takes the same path at smaller sizes.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import cli


@pytest.mark.slow
def test_cpu_defaults_are_sized_for_the_host_and_say_why(tmp_path):
    state = tmp_path / "state"
    started = cli("start", "local-compile-perf", "--target", "embedded", "--json", state_dir=state)
    assert started.returncode == 0, started.stderr
    run_id = json.loads(started.stdout)["run_id"]

    planned = cli("advance", run_id, "--max-phases", "1", state_dir=state, timeout=600)
    assert planned.returncode == 0, planned.stderr[-3000:]
    run = json.loads((state / "runs" / run_id / "run.json").read_text())
    assert run["phase"] == "baselines", run["summary"]
    sizes = run["results"]["plan"]["sizes"]
    assert sizes["tokens"] == [256, 512, 1024] and sizes["per_layer_tokens"] == [512]
    assert sizes["source"] == "cpu defaults" and sizes["timing"] == {"warmup": 2, "iters": 5, "profile_steps": 2}
    plan_md = (state / "runs" / run_id / "artifacts" / "plan.md").read_text()
    assert "why these sizes (cpu defaults): a CPU host" in plan_md and "per-layer compile at: 512" in plan_md
    assert cli("audit", run_id, state_dir=state).returncode == 0
