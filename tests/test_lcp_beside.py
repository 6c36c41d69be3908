"""The graph count and the TP/EP build check run side by side, each in its own worker process.

Both compile and time nothing; one after the other they took 68 + 75 s of a device call (H200, 2026-12-04).
Here the calls are small functions of this module, run by the real worker machinery.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

from phases.local_compile_perf.work.beside import BesideCall, beside_worker


def nap(request: dict) -> dict:
    time.sleep(request["s"])
    return {"slept": request["s"], "t": time.monotonic()}


def broken(request: dict) -> dict:
    raise RuntimeError("aten.mm.default got mixed torch.Tensor and DTensor")


def call(label: str, func: str, **request) -> BesideCall:
    return BesideCall(label=label, func=f"tests.test_lcp_beside:{func}", request=request)


def test_calls_run_at_once_and_each_answers_or_says_how_it_failed(capsys) -> None:
    started = time.monotonic()
    answer = beside_worker({"calls": [call("graph budget", "nap", s=2.0).model_dump(),
                                      call("TP/EP build check", "broken").model_dump(),
                                      call("another", "nap", s=2.0).model_dump()]})
    took = time.monotonic() - started
    first, failed, third = answer["results"]
    assert first["answer"]["slept"] == 2.0 and third["answer"]["slept"] == 2.0 and first["status"] == "ok"
    assert took < 2 * 2.0 + 1.5, f"side by side, not one after the other: {took:.1f} s"
    assert failed["answer"] is None and failed["status"] == "failed"
    assert "RuntimeError: aten.mm.default got mixed torch.Tensor and DTensor" in failed["error"]
    log = capsys.readouterr().err
    assert "===== graph budget: ok (exit 0)" in log and "===== TP/EP build check: failed" in log


def test_a_check_that_gave_no_answer_is_unrun_with_its_last_words(monkeypatch) -> None:
    from phases.kit.graphs import GraphBudgetRequest
    from phases.local_compile_perf import graph_budget
    from phases.local_compile_perf.records import Plan
    from phases.local_compile_perf.work.beside import BesideAnswer

    results = [{"label": "graph budget", "answer": {"x": 1}, "status": "ok", "returncode": 0, "seconds": 1.0},
               {"label": "TP/EP build check of the candidate", "answer": None, "status": "failed", "returncode": 1,
                "seconds": 1.0, "error": "Traceback ...\nValueError: not enough values to unpack"}]

    class Ctx:
        scratch_dir, phase, interrupted = None, "graph_budget", False

        def call(self, worker, request, *, label):  # noqa: ANN001, ANN201 - PhaseContext.call's
            assert [c.label for c in request.calls] == ["graph budget", "TP/EP build check of the candidate"]
            return BesideAnswer.model_validate({"results": results})

    prepared = SimpleNamespace(candidate_checkout="/cand", tree_regions=("router", "swiglu"))
    plan = Plan.model_construct(kind="embedded", harness="examples.moe_layer.harness:build_harness", device="cpu")
    request = GraphBudgetRequest(harness=plan.harness, device="cpu", regions=("router",), tokens=(8, 16, 32))
    monkeypatch.setattr(graph_budget, "call_kept", lambda ctx, w, r, *, label: ctx.call(w, r, label=label))
    count, check = graph_budget.count_beside_build_check(Ctx(), plan, prepared, request)
    assert count.answer == {"x": 1}
    assert check.status == "UNRUN" and check.reason == "worker failed: ValueError: not enough values to unpack"
