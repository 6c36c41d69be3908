"""A toy workflow with a temporary-patch phase, to test the engine's ledger generically.

``probe`` waits for the agent until ``core/value.txt`` holds "fixed" (measured by a worker);
patches are accepted only in that phase, never inside the permanent scope ``exp/``, and
each is measured by reading ``core/value.txt`` in a fresh worker process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from orchestrator import ledger
from orchestrator.phase_api import Issue, PhaseResult
from orchestrator.workflow import PhaseSpec, Prepared, Workflow
from tests.toyflow.worker_fns import READ_VALUE


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid")
    target: str


def prepare(options: Options, state_dir: str, *, runner: Any = None) -> Prepared:
    return Prepared(target=str(Path(options.target).resolve()), options=options.model_dump())


def take_patch(ctx: Any, args: Any, tool_call_id: str | None) -> None:
    applied = ledger.accept_patch(ctx, args, tool_call_id)
    ctx.add_record("gap_row", {"label": args.label, "patch_id": applied["patch_id"], **measure(ctx, args.label)})


def measure(ctx: Any, label: str) -> dict[str, Any]:
    answer = ctx.call(READ_VALUE, {"path": "core/value.txt"}, label=label)
    return {"value": answer.value, "log": ctx.last_worker_log}


def run(ctx: Any) -> PhaseResult:
    rows = ctx.state["records"].get("gap_row", [])
    if rows and rows[-1]["value"] == "fixed":
        proof = ledger.revert_all(ctx)
        return PhaseResult(outcome="passed", summary="explained", data={"reverted": proof, "rows": rows})
    reverted = ledger.revert_if_waived(ctx, "unexplained")
    return PhaseResult(outcome="needs_agent", summary="submit patches",
                       data={} if reverted is None else {"reverted": reverted, "rows": rows},
                       issues=(Issue(code="unexplained", message="patch core/value.txt", fix_location="core/"),))


def reconcile(ctx: Any) -> PhaseResult:
    ledger.revert_all(ctx)
    return run(ctx)


WORKFLOW = Workflow(
    name="patchy", description="ledger test workflow", options=Options, prepare=prepare,
    phases=(PhaseSpec(name="probe", module="tests.toyflow.patchflow"),),
    scope=("exp/",),
    submissions={"patch": ledger.patch_row("probe", check="tests.toyflow.patchflow:take_patch")},
)
