"""A small workflow that exercises every engine edge without torch (tests only).

ask (human question) -> work (worker subprocess, artifact, measurement) -> fix (waits for
the agent until the target has ``allowed/fixed.txt``) -> done. Guard: edits only under
``allowed/``. Gate into ``work``: the color was answered.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from orchestrator.errors import UsageError
from orchestrator.git import changed_paths
from orchestrator.workflow import PhaseSpec, Prepared, Violation, Workflow


class ToyOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    target: str
    color: str | None = None
    sleep: float = 0.0
    worker: str = "ok"
    """ok | die (the worker kills itself) | slow (sleeps ``sleep`` seconds once per marker)."""
    marker: str = ""
    """File a slow worker creates before sleeping; when it exists the worker does not sleep."""
    config: str | None = None
    """An input file the run is given (as add-moe-model's ``--model config.json``): the engine records its hash."""


def prepare(options: ToyOptions, state_dir: str, *, runner: Any = None) -> Prepared:
    target = Path(options.target).resolve()
    if not (target / ".git").is_dir():
        raise UsageError(f"{target} is not a git checkout")
    answers = {"color": options.color} if options.color else {}
    return Prepared(target=str(target), options=options.model_dump(), answers=answers)


def scope_guard(state: dict[str, Any]) -> Violation | None:
    outside = [p for p in changed_paths(state["target"], state["base"]["commit"]) if not p.startswith("allowed/")]
    if outside:
        return Violation(message=f"{len(outside)} path(s) outside allowed/: {', '.join(outside)}; revert them",
                         paths=tuple(outside))
    return None


def color_answered(state: dict[str, Any]) -> list[str]:
    return [] if state["answers"].get("color") else ["the color question is unanswered"]


def no_blue_rule(events: list[dict[str, Any]], state: dict[str, Any]) -> list[tuple[int, str]]:
    return [(e["seq"], "blue is not allowed") for e in events
            if e["type"] == "answer_accepted" and e["data"]["value"] == "blue-forbidden"]


WORKFLOW = Workflow(
    name="toy",
    description="engine test workflow",
    phases=(
        PhaseSpec(name="ask", module="tests.toyflow.ask", title="ask the color",
                  results="tests.toyflow.ask:take_results"),
        PhaseSpec(name="work", module="tests.toyflow.work", title="square in a worker", gates=("color_answered",),
                  timeout_s=60),
        PhaseSpec(name="fix", module="tests.toyflow.fix", title="wait for the agent's fix"),
    ),
    options=ToyOptions,
    prepare=prepare,
    gates={"color_answered": color_answered},
    guards={"scope": scope_guard},
    rules={"no_blue": no_blue_rule},
    human_options=("color",),
)
