"""Workflow tables are checked when built, and the machine answers may_* without effects."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from orchestrator import engine
from orchestrator.errors import WorkflowDefinitionError
from orchestrator.schemas import DEFAULT_DIR, generate, render
from orchestrator.workflow import PhaseSpec, Workflow, load_workflow


class NoOptions(BaseModel):
    pass


def test_every_problem_is_reported_at_once():
    with pytest.raises(WorkflowDefinitionError) as info:
        Workflow(
            name="broken", description="", options=NoOptions, prepare=lambda o, s: None,
            phases=(
                PhaseSpec(name="a", module="tests.toyflow.ask", gates=("nope",), routes={"x": "zzz", "next": "done"}),
                PhaseSpec(name="b", module="tests.toyflow.nonexistent"),
                PhaseSpec(name="a", module="tests.toyflow.ask"),
            ),
        )
    message = str(info.value)
    for part in ("gate 'nope' unknown", "unknown phase 'zzz'", "cannot import tests.toyflow.nonexistent",
                 "declared twice", "'b' unreachable"):
        assert part in message, message


def test_may_route_is_a_dry_check():
    workflow = load_workflow("toy")
    state = {"phase": "ask", "answers": {}}
    model = engine.build_machine(workflow, state)
    assert model.may_route_next() is False
    assert engine.blocking_reasons(workflow, state) == ["the color question is unanswered"]
    state["answers"]["color"] = "red"
    assert model.may_route_next() is True
    assert model.state == "ask", "may_* must not move the machine"


def test_committed_schemas_are_current():
    for name, schema in generate().items():
        path = DEFAULT_DIR / name
        assert path.is_file(), f"{path} missing: run python -m orchestrator.schemas"
        assert path.read_text() == render(schema), f"{path} is stale: run python -m orchestrator.schemas"


def test_plain_dict_snapshot_matches_its_documented_model():
    from orchestrator.trail.snapshot import empty_state
    from orchestrator.trail.snapshot_schema import RunSnapshot

    documented = RunSnapshot(run_id="r", workflow="", target="", phase="").model_dump(mode="json")
    assert empty_state("r") == documented
