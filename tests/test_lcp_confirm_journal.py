"""A confirmation cut midway and rerun measures only the fresh processes that had not finished.

A device call ends at its limit wherever the run stands; the phase then reruns from its start. Before the
journal, every fresh process of the cut phase ran again (the H200 call of 2026-12-04 redid both correctness
captures, 200 s). Here the runs are a stub that counts its calls, and the cut is an exception after the
third run.
"""

from __future__ import annotations

import pytest

from phases.kit.harness import TimingKnobs
from phases.kit.records import RunOutcome
from phases.local_compile_perf.work import measure_trees
from phases.local_compile_perf.work.measure_trees import ConfirmRequest, Variant


class Cut(Exception):
    """The device call's limit, as the worker sees it."""


def request(journal: str, *, runs: int = 3) -> dict:
    variants = tuple(Variant(name=n, checkout=".", tree=t, tokens=(256,)) for n, t in (("a", "eager"),
                                                                                       ("b", "upstream")))
    return ConfirmRequest(harness="h:f", device="cpu", variants=variants, runs=runs, timing=TimingKnobs(),
                          journal=journal).model_dump(mode="json")


@pytest.fixture
def measured(monkeypatch):
    """Every stub run as (variant tree, round index), in order; ``cut_after`` raises Cut after that many."""
    calls: list[tuple[str, int]] = []
    state = {"cut_after": None}

    def run_in(variant, command, *, index, poll, timeout_s, run_once):  # noqa: ANN001, ANN202 - _run_in's
        if state["cut_after"] is not None and len(calls) == state["cut_after"]:
            raise Cut
        calls.append((variant.name, index))
        return RunOutcome(index=index, status="ok", result={"256": {"n": len(calls)}}, returncode=0).model_dump()

    monkeypatch.setattr(measure_trees, "_run_in", run_in)
    monkeypatch.setattr("phases.kit.confirm.probe_gpu_pids", lambda: None)
    return calls, state


def test_a_rerun_reads_back_the_runs_that_finished_and_measures_the_rest_in_order(tmp_path, measured) -> None:
    calls, state = measured
    journal = str(tmp_path / "confirm.jsonl")
    state["cut_after"] = 3
    with pytest.raises(Cut):
        measure_trees.confirm_variants_worker(request(journal))
    assert calls == [("a", 0), ("b", 0), ("b", 1)]
    state["cut_after"] = None
    answer = measure_trees.confirm_variants_worker(request(journal))
    assert calls[3:] == [("a", 1), ("a", 2), ("b", 2)], "only the runs the cut left out, in the rotated order"
    assert answer["carried"] == ["a#0", "b#0", "b#1"] and answer["machine"].startswith("boot ")
    by_name = {v["variant"]["name"]: [r["result"]["256"]["n"] for r in v["runs"]] for v in answer["variants"]}
    assert by_name == {"a": [1, 4, 5], "b": [2, 3, 6]}, "each run keeps its own result, carried or new"
    again = measure_trees.confirm_variants_worker(request(journal))
    assert len(calls) == 6 and len(again["carried"]) == 6


def test_another_request_or_another_machine_reads_nothing_back(tmp_path, measured, monkeypatch) -> None:
    calls, _state = measured
    journal = str(tmp_path / "confirm.jsonl")
    measure_trees.confirm_variants_worker(request(journal, runs=1))
    assert measure_trees.confirm_variants_worker(request(journal, runs=2))["carried"] == [], "another request"
    monkeypatch.setattr("phases.kit.confirm.machine_id", lambda: "boot other, gpu none")
    assert measure_trees.confirm_variants_worker(request(journal, runs=1))["carried"] == [], "another machine"
    with open(journal, "a") as f:
        f.write('{"key": "torn')
    monkeypatch.undo()
    monkeypatch.setattr(measure_trees, "_run_in", lambda *a, **k: pytest.fail("nothing is left to measure"))
    monkeypatch.setattr("phases.kit.confirm.probe_gpu_pids", lambda: None)
    assert len(measure_trees.confirm_variants_worker(request(journal, runs=1))["carried"]) == 2, "torn line skipped"


class StubContext:
    """What call_confirm asks of a phase context: a scratch dir, the phase, one CONFIRM call and notes."""

    def __init__(self, tmp_path, answer: dict) -> None:
        self.scratch_dir, self.phase, self.answer, self.interrupted = tmp_path, "findings", answer, True
        self.requests, self.notes = [], []

    def call(self, worker, req, *, label: str = ""):  # noqa: ANN001, ANN201 - PhaseContext.call's
        self.requests.append(req)
        return worker.answer.model_validate(self.answer)

    def note(self, text: str, *, kind: str = "devlog") -> None:
        self.notes.append((kind, text))


def test_the_phase_journals_per_phase_and_label_and_the_devlog_names_what_was_read_back(tmp_path) -> None:
    from phases.local_compile_perf.confirmed import call_confirm

    req = ConfirmRequest.model_validate(request(""))
    answer = {"variants": [], "orders": [], "gpu_poll": "nvidia-smi", "carried": ["a#0"], "machine": "boot x, gpu y"}
    ctx = StubContext(tmp_path, answer)
    call_confirm(ctx, req, label="stack under selective AC")
    assert ctx.requests[0].journal == str(tmp_path / "journal" / "findings-stack-under-selective-AC.jsonl")
    assert ctx.notes == [("measurement", "stack under selective AC: 1 of 6 fresh processes read back from the "
                                         "attempt that was cut, measured on this machine (boot x, gpu y): a#0")]


def test_an_attempt_that_was_not_cut_starts_a_fresh_journal(tmp_path) -> None:
    from phases.local_compile_perf.confirmed import call_confirm

    answer = {"variants": [], "orders": [], "gpu_poll": "nvidia-smi"}
    ctx = StubContext(tmp_path, answer)
    journal = tmp_path / "journal" / "findings-cold-compile.jsonl"
    journal.parent.mkdir()
    journal.write_text('{"key": "an earlier submission"}\n')
    ctx.interrupted = False
    call_confirm(ctx, ConfirmRequest.model_validate(request("")), label="cold compile")
    assert not journal.exists() and ctx.notes == []
