"""A toy workflow whose one phase reads Python sources the way add-moe-model's guard does.

``read`` runs ``forbidden_uses`` (the AST reading of the forbidden-calls guard) over a large
Python file of the standard library, many times, while objects with finalizers are collected
(as GitPython's repositories and subprocess handles are in a real advance). Two such phases
in two threads of one process once crashed with CPython 3.11's "SystemError: AST constructor
recursion depth mismatch"; the MCP server runs each call in a process of its own.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from orchestrator.phase_api import PhaseResult
from orchestrator.workflow import PhaseSpec, Prepared, Workflow
from phases.add_moe_model.forbidden import forbidden_uses

READS = 40


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid")
    target: str


def prepare(options: Options, state_dir: str, *, runner: Any = None) -> Prepared:
    return Prepared(target=str(Path(options.target).resolve()), options=options.model_dump())


class _Held:
    """Something with a finalizer, caught in a reference cycle (collected by the garbage collector)."""

    def __init__(self) -> None:
        self.cycle = self

    def __del__(self) -> None:
        sum(range(20))


def run(ctx: Any) -> PhaseResult:
    source = Path(ast.__file__).read_text()
    found = 0
    for _ in range(READS):
        _Held()
        found += len(forbidden_uses(source))
    return PhaseResult(outcome="passed", summary=f"read {READS} times, {found} forbidden uses")


WORKFLOW = Workflow(
    name="parsetoy", description="AST reads in the engine process", options=Options, prepare=prepare,
    phases=(PhaseSpec(name="read", module="tests.toyflow.parseflow"),),
)
