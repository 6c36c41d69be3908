"""Worker entry points of the kit (dict -> dict, validated both ways) and the no-torch import rule."""

from __future__ import annotations

import json
import subprocess
import sys

from orchestrator.progress import parse
from phases.kit.graphs import graph_budget_worker
from phases.kit.records import Correctness, GraphCount
from tests.conftest import ROOT

TINY = "tests.test_kit_tiny_harness:build_harness"


def test_kit_modules_import_without_torch():
    mods = ["harness", "records", "timing", "cudagraph", "profile", "graphs", "bandwidth", "ideal", "rank", "screen",
            "confirm", "measure_once", "correctness", "provenance"]
    code = ("import sys\n" + "".join(f"import phases.kit.{m}\n" for m in mods)
            + "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_graph_budget_worker_round_trips(capsys):
    answer = graph_budget_worker({"harness": TINY, "regions": ["rms_norm"], "tokens": [8, 16], "device": "cpu",
                                  "dtype": "fp32"})
    count = GraphCount.model_validate(json.loads(json.dumps(answer)))
    assert count.per_function == {"rms_norm": 4} and count.within_target  # fwd+bwd, then no_grad, per token count
    # progress as it goes (blind trial of 2026-12-05: 28-52 s of silence after "worker graph budget started")
    progress = [parse(line) for line in capsys.readouterr().err.splitlines() if parse(line) is not None]
    assert len(progress) == 5 and progress[0].startswith("graph count: loading the harness to count rms_norm")
    assert progress[1:3] == ["graph count: fwd+bwd at 8 tokens (step 1 of 2, ETA after the first step)",
                             "graph count: no_grad forward at 8 tokens"]
    assert progress[3].startswith("graph count: fwd+bwd at 16 tokens (step 2 of 2, ETA ")
    assert progress[4] == "graph count: no_grad forward at 16 tokens"


def test_correctness_workers_round_trip(tmp_path):
    """The phase's path: the stack's eager captures saved by one worker, compared by the next."""
    from phases.local_compile_perf.work.candidate_checks import capture_worker, compare_worker

    common = {"harness": TINY, "tokens": 16, "device": "cpu"}
    ref = capture_worker({**common, "tree": "eager", "dtypes": ["bf16", "fp32", "fp64"], "out": str(tmp_path / "r.pt")})
    answer = compare_worker({"candidate": {**common, "tree": "regions:swiglu", "dtypes": ["bf16", "fp32"]},
                             "reference": ref["file"], "downcasts": ref["downcasts"]})
    res = Correctness.model_validate(json.loads(json.dumps(answer)))
    assert res.ok and len(res.comparisons) == 4 and res.reference_dtype == "float64"
