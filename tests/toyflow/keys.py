"""A toy workflow for proven fixes: ``check`` raises one finding per key ``allowed/config.txt`` lacks.

``need`` names the keys (comma-separated); ``layer`` is a number the messages name, as a model's layer
index does, so two runs of different "models" raise the same finding with different numbers. A key named
``opt_*`` raises its own code (``optional_key_missing``), one a person may waive. The agent may edit
``allowed/`` only (the scope guard holds it there).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from orchestrator.phase_api import Issue, PhaseResult
from orchestrator.workflow import PhaseSpec, Prepared, Workflow
from tests.toyflow import scope_guard

CONFIG = "allowed/config.txt"


class KeyOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    target: str
    need: str = "alpha"
    layer: int = 1


def prepare(options: KeyOptions, state_dir: str, *, runner: Any = None) -> Prepared:
    return Prepared(target=str(Path(options.target).resolve()), options=options.model_dump())


def run(ctx: Any) -> PhaseResult:
    config = ctx.target / CONFIG
    have = {line.split("=")[0].strip() for line in config.read_text().splitlines()} if config.is_file() else set()
    missing = [key for key in ctx.options["need"].split(",") if key not in have]
    if not missing:
        return PhaseResult(outcome="passed", summary="every key is set")
    layer = ctx.options["layer"]
    return PhaseResult(outcome="needs_agent", summary=f"{len(missing)} key(s) missing", issues=tuple(
        Issue(code=code_of(key), message=f"model.layers.{layer}.config lacks key {key!r}", fix_location=CONFIG)
        for key in missing))


def code_of(key: str) -> str:
    return "optional_key_missing" if key.startswith("opt_") else "key_missing"


WORKFLOW = Workflow(
    name="keys", description="proven-fix test workflow", options=KeyOptions, prepare=prepare,
    phases=(PhaseSpec(name="check", module="tests.toyflow.keys", allowed_paths=("allowed/",)),),
    guards={"scope": scope_guard}, scope=("allowed/",),
)
