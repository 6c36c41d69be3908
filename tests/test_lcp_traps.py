"""Trap checks on real harnesses: the embedded one passes, each broken variant is caught."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from examples.moe_layer.harness import build_harness  # noqa: E402
from phases.local_compile_perf.work.traps import (  # noqa: E402
    check_accumulating_grads,
    check_detached_inputs,
    check_dtype_init,
    check_harness_traps,
    check_precision,
    check_unseeded_state,
)
from phases.local_compile_perf.workspace import materialize_embedded_workspace  # noqa: E402

PROJECT_ROOT = Path(__file__).resolve().parents[1]
KW = dict(tokens=32, device="cpu", dtype=torch.bfloat16)


@pytest.fixture(scope="session")
def harness():
    return build_harness(scale="small")


class DetachedInputs:
    """Forward runs on a detached copy: the input never gets a grad."""

    def __init__(self, inner):
        self.spec, self.inner = inner.spec, inner

    def build(self, **kw):
        workload = self.inner.build(**kw)
        forward = workload.forward

        def detached_forward():
            (x,) = workload.inputs
            workload.inputs = (x.detach().requires_grad_(False),)
            try:
                return forward()
            finally:
                workload.inputs = (x,)

        workload.forward = detached_forward
        return workload

    def bind_regions(self, regions):
        self.inner.bind_regions(regions)


class AccumulatingGrads(DetachedInputs):
    """step() forgets to set grads to None."""

    def build(self, **kw):
        workload = self.inner.build(**kw)

        def step():
            loss = workload.forward().float().square().mean()
            loss.backward()
            return loss.detach()

        workload.step = step
        return workload


class UnseededBuffer(DetachedInputs):
    """A buffer drawn from an unseeded generator after the seed was set."""

    def build(self, **kw):
        workload = self.inner.build(**kw)
        noise = torch.randn(8, generator=torch.Generator().manual_seed(torch.seed()))
        workload.layers[0].register_buffer("noise", noise)
        return workload


def test_embedded_harness_passes_every_trap(harness):
    findings = check_harness_traps(harness, tokens=32, device="cpu", target=PROJECT_ROOT)
    assert [f.trap for f in findings] == ["detached_inputs", "accumulating_grads", "unseeded_state", "dtype_init",
                                          "precision_mismatch"]
    assert all(f.status == "pass" for f in findings), [f.message for f in findings]


def test_detached_input_is_caught(harness):
    finding = check_detached_inputs(DetachedInputs(harness), **KW)
    assert finding.status == "fail" and "got no grad" in finding.message


def test_accumulating_grads_are_caught(harness):
    finding = check_accumulating_grads(AccumulatingGrads(harness), **KW)
    assert finding.status == "fail"
    assert "same grad object" in finding.message
    assert 0.5 < finding.evidence["max_rel_l2"] < 1.5  # the second step added a second grad


def test_unseeded_buffer_is_caught(harness):
    finding = check_unseeded_state(UnseededBuffer(harness), **KW)
    assert finding.status == "fail" and "0.noise" in finding.message


class DrawsInItsDtype(DetachedInputs):
    """Weights drawn in the build's own dtype: the seed gives another model in fp64 than in fp32."""

    def build(self, **kw):
        workload = self.inner.build(**kw)
        torch.manual_seed(kw["seed"])
        with torch.no_grad():
            for p in workload.layers.parameters():
                p.uniform_(-0.1, 0.1)
        return workload


def test_dtype_dependent_draws_are_caught(harness):
    assert check_dtype_init(harness, **KW).status == "pass"
    finding = check_dtype_init(DrawsInItsDtype(harness), **KW)
    assert finding.status == "fail" and "float64 build are another draw" in finding.message, finding.message
    assert finding.evidence["max_rel_l2"] > 1.0


def test_precision_mismatch_is_caught(harness):
    wrong = build_harness(scale="small")
    wrong.spec = wrong.spec.model_copy(update={"fp32_precision": "ieee"})
    finding = check_precision(wrong, target=PROJECT_ROOT, **KW)
    assert finding.status == "fail" and "trainer sets 'tf32'" in finding.message


@pytest.mark.slow
def test_worker_entry_in_the_workspace(tmp_path):
    """run_trap_checks in a fresh process with the workspace as target (cwd, first on sys.path)."""
    ws = materialize_embedded_workspace(tmp_path / "state")
    request = json.dumps({"harness": "examples.moe_layer.harness:build_harness", "tokens": 32, "device": "cpu"})
    code = (
        "import json, sys\n"
        "from phases.local_compile_perf.work.traps import run_trap_checks\n"
        "import examples.moe_layer\n"
        f"assert examples.moe_layer.__file__.startswith({str(ws)!r})\n"
        "print(json.dumps(run_trap_checks(json.loads(sys.argv[1]))))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, request], cwd=ws, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    assert answer["passed"] is True, answer["findings"]
    assert answer["spec"]["name"] == "embedded:dsv3-small"
    assert "@@progress" in proc.stderr
