"""A new user's run on CPU with the defaults: plan .. rank finishes, and says how long it will take.

Issue 16 tried it as a new user would: ``start local-compile-perf --target embedded`` then
``advance`` on a 2-core host, and after 25 minutes it was still in its first eager baseline
(the skill's 2k/4k/16k tokens x 5/20/5 steps) with no sign of how long it would take. On a
CPU the defaults are now sized for the host, the plan says which and why, and the long
phases report each fresh process with an ETA. (Measured on the 2-core dev host with four
other jobs on it: see docs/local-compile-perf.md.)
"""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import cli


@pytest.mark.slow
def test_cpu_defaults_reach_pick_fix_with_progress(tmp_path):
    state = tmp_path / "state"
    started = cli("start", "local-compile-perf", "--target", "embedded", "--json", state_dir=state)
    assert started.returncode == 0, started.stderr
    run_id = json.loads(started.stdout)["run_id"]

    began = time.monotonic()
    advanced = cli("advance", run_id, state_dir=state, timeout=3000)
    elapsed = time.monotonic() - began
    assert advanced.returncode == 4, advanced.stderr[-3000:]  # waits on the agent in pick_fix
    assert "baselines: fresh process 1/3 of eager at [256, 512, 1024] tokens (step 1 of 9" in advanced.stderr
    assert "(step 2 of 9, ETA " in advanced.stderr, advanced.stderr[-3000:]

    run = json.loads((state / "runs" / run_id / "run.json").read_text())
    assert run["phase"] == "pick_fix", f"after {elapsed:.0f} s"
    sizes = run["results"]["plan"]["sizes"]
    assert sizes["tokens"] == [256, 512, 1024] and sizes["per_layer_tokens"] == [512]
    assert sizes["source"] == "cpu defaults" and sizes["timing"] == {"warmup": 2, "iters": 5, "profile_steps": 2}
    plan_md = (state / "runs" / run_id / "artifacts" / "plan.md").read_text()
    assert "why these sizes (cpu defaults): a CPU host" in plan_md and "per-layer compile at: 512" in plan_md
    measured = {(r["variant"], r["tokens"]) for r in run["results"]["baselines"]["rows"] if r["status"] == "measured"}
    assert measured == {(v, t) for v in ("eager", "upstream") for t in (256, 512, 1024)} | {("per_layer", 512)}
    assert cli("audit", run_id, state_dir=state).returncode == 0
