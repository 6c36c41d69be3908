"""Types in the table: what a phase returns and what each record kind is, checked when built and when produced."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict

from orchestrator.context import phase_context
from orchestrator.errors import RecordInvalid, UsageError, WorkflowDefinitionError
from orchestrator.git import capture_base
from orchestrator.phase_api import PhaseResult
from orchestrator.schemas import check_records
from orchestrator.trail.events import RunStarted
from orchestrator.trail.store import RunStore
from orchestrator.workflow import PhaseSpec, Workflow


class NoOptions(BaseModel):
    pass


class Square(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    square: int
    pid: int


class Row(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    label: str
    value: float


def table(**extra: object) -> Workflow:
    return Workflow(name="typed", description="", options=NoOptions, prepare=lambda o, s, **_: None,
                    phases=(PhaseSpec(name="ask", module="tests.toyflow.ask"),
                            PhaseSpec(name="work", module="tests.toyflow.work", returns=Square)),
                    records={"row": Row}, **extra)


def test_types_that_are_not_models_are_reported_with_every_other_problem():
    with pytest.raises(WorkflowDefinitionError) as info:
        Workflow(name="broken", description="", options=NoOptions, prepare=lambda o, s, **_: None,
                 phases=(PhaseSpec(name="a", module="tests.toyflow.ask", gates=("nope",), returns=dict),),
                 records={"row": int, "one": Row, "two": Row}, after_phase=("not callable",))
    message = str(info.value)
    for part in ("gate 'nope' unknown", "phase 'a': returns <class 'dict'> is not a pydantic model",
                 "record kind 'row': <class 'int'> is not a pydantic model", "'one', 'two' share Row",
                 "after_phase hook 'not callable' is not callable"):
        assert part in message, message


def test_a_passing_result_that_is_not_its_model_fails_the_phase():
    workflow = table()
    good = PhaseResult(outcome="passed", summary="ok", data={"square": 49, "pid": 1})
    assert workflow.check_result("work", good) is good
    waiting = PhaseResult(outcome="needs_agent", summary="wait", data={"half": True})
    assert workflow.check_result("work", waiting) is waiting, "only what passes on is held to the model"
    bad = workflow.check_result("work", PhaseResult(outcome="passed", summary="ok", data={"square": "many"}))
    assert bad.outcome == "failed" and bad.data["code"] == "result_invalid"
    assert "work: its result is not a Square (returns= in the typed table): square:" in bad.summary


def test_results_and_records_come_back_typed_and_records_are_checked_when_added(toy_repo, state_dir):
    store = RunStore(state_dir)
    store.create_run("typed-1", RunStarted(workflow="typed", target=str(toy_repo), options={},
                                           base=capture_base(toy_repo), initial_phase="ask"))
    workflow = table()
    with store.open_run("typed-1") as run:
        ctx = phase_context(run, workflow, phase="work")
        ctx.results["work"] = {"square": 49, "pid": 7}
        assert ctx.result("work") == Square(square=49, pid=7)
        with pytest.raises(UsageError, match="declares no returns= for phase 'ask'"):
            ctx.result("ask")
        ctx.add_record("row", Row(label="a", value=1.5))
        ctx.add_record("row", {"label": "b", "value": 2})
        ctx.add_record("free", {"anything": True})
        with pytest.raises(RecordInvalid, match="a 'row' record is not a Row"):
            ctx.add_record("row", {"label": "c"})
        assert ctx.records(Row) == [Row(label="a", value=1.5), Row(label="b", value=2.0)]
        with pytest.raises(UsageError, match="declares no record kind of Square"):
            ctx.records(Square)
    events = store.read_events("typed-1")
    assert [e["data"]["kind"] for e in events if e["type"] == "record_added"] == ["row", "row", "free"]
    forged = {"seq": 99, "type": "record_added", "data": {"type": "record_added", "kind": "row", "record": {}}}
    findings = check_records([*events, forged], workflow)
    assert [(f.seq, f.check) for f in findings] == [(99, "schema")] and "row record is not a Row" in findings[0].message


def test_the_worker_process_validates_both_sides_by_the_handles_models(toy_repo):
    from orchestrator.phase_api import Worker
    from orchestrator.worker import run_worker
    from tests.toyflow.worker_fns import SQUARE, ReadAnswer

    request = {"n": 3, "mode": "ok", "sleep": 0, "marker": ""}
    typed = run_worker(SQUARE.ref, request, target=toy_repo, models=SQUARE.models())
    assert typed.status == "ok" and typed.answer["square"] == 9
    refused = run_worker(SQUARE.ref, {**request, "n": "three"}, target=toy_repo, models=SQUARE.models())
    assert refused.answer is None and b"SquareRequest" in refused.log, "a bad request fails before the call"
    wrong = Worker(SQUARE.ref, SQUARE.request, ReadAnswer)
    answered = run_worker(wrong.ref, request, target=toy_repo, models=wrong.models())
    assert answered.answer is None and b"ReadAnswer" in answered.log, "an answer its model refuses is never written"


@pytest.mark.parametrize(("name", "package", "recorded"), [
    ("add-moe-model", "add_moe_model", {"model_id", "model_name", "model_source"}),  # recorded by start.prepare
    ("local-compile-perf", "local_compile_perf", set())])
def test_every_option_a_phase_reads_is_declared(name, package, recorded):
    """An option no model declares is always its default (numerics once read options["seed"] that way)."""
    import re

    from orchestrator.workflow import load_workflow
    from tests.conftest import ROOT

    read = {key for path in (ROOT / "phases" / package).rglob("*.py")
            for key in re.findall(r"options(?:\.get\(|\[)\"(\w+)\"", path.read_text())}
    declared = set(load_workflow(name).options.model_fields) | recorded
    assert read and read <= declared, f"options read but not declared: {sorted(read - declared)}"
