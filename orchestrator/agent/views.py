"""What the agent tools answer about a run: the status line, why it waits, the next steps."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.agent import files
from orchestrator.agent.tool_args import Status, ToolResult
from orchestrator.errors import OrchestratorError, RunIsFinished


def state_result(state: dict[str, Any], *, exit_code: int | None = None, messages: tuple[str, ...] = (),
                 lead: str = "") -> ToolResult:
    """A run's status view as a tool result; waiting_for_human when a person must act next."""
    from orchestrator.engine import exit_code_for
    from orchestrator.render import status_view

    view = status_view(state)
    code = exit_code_for(state) if exit_code is None else exit_code
    line = f"run {state['run_id']}: phase {state['phase']}, status {state['status']}"
    if state.get("awaiting"):
        line += f", waiting for {state['awaiting']}"
    if state.get("summary"):
        line += f" ({state['summary']})"
    parts = [p for p in (lead, line, *messages) if p]
    status: Status = "ok"
    if state.get("awaiting") == "human" and state["status"] not in ("done", "aborted"):
        status = "waiting_for_human"
        parts.append("a person must answer with `orchestrator resume`; stop working on this run")
    return ToolResult(status=status, message="; ".join(parts), data={**view, "exit_code": code})



BUSY_STEP = "wait: another process holds the run; call status or explain again once it lets go"


def why_waiting(state: dict[str, Any], *, busy: bool = False) -> str:
    """``busy``: another process holds the run now (``RunStore.busy``), so what it last committed may be moving."""
    if state["status"] in ("done", "aborted"):
        return f"the run is {state['status']}: {state['summary']}"
    if busy:
        return (f"another process holds the run now (an advance or an acting call): phase {state['phase']} may be "
                "running, and this is its last committed state; an acting call is refused as busy until it ends")
    if state["violations"]:
        return "a rule is broken: " + "; ".join(f"{v['guard']}: {v['message']}" for v in state["violations"])
    if state["awaiting"] == "human":
        return "waiting for a human: " + "; ".join(human_asks(state))
    if state["awaiting"] == "job":
        return f"waiting for cluster job(s): {state['summary']}; advance again once they end"
    if state["awaiting"] == "agent":
        codes = ", ".join(i["code"] for i in state["issues"]) or "see pending questions"
        return f"phase {state['phase']} needs the agent: {codes}"
    if state["status"] == "failed":
        return f"phase {state['phase']} failed: {state['summary']}"
    return f"phase {state['phase']} is ready to run; call advance"


def human_asks(state: dict[str, Any]) -> list[str]:
    """What a person is waited on for: the pending questions, else the findings only a person can pass."""
    if state["pending"]:
        return [f"answer {', '.join(q['key'] for q in state['pending'])}"]
    codes = ", ".join(i["code"] for i in state["issues"])
    if codes:
        return [f"a decision on {codes} (waive with a reason, or abort)"]
    return [f"the phase's summary: {state['summary']}"]


def what_a_person_can_do(state: dict[str, Any]) -> list[str]:
    """The commands by which a person moves a run the agent cannot: waive each finding, or abort."""
    run_id = state["run_id"]
    waivers = [f"waive {i['code']}: `orchestrator resume {run_id} --waive {i['code']} --reason TEXT`"
               for i in state["issues"]]
    return [*waivers, f"answer: `orchestrator resume {run_id} --answer KEY=VALUE`",
            f"stop the run: `orchestrator abort {run_id} --reason TEXT`"]


def next_steps(state: dict[str, Any], spec: Any, *, submissions: Mapping[str, Any] | None = None,
               offers: Sequence[dict[str, Any]] = ()) -> list[str]:
    """What the agent can do now, in order; ``submissions``: the phase's submission rows by kind; ``offers``:
    the proven fixes offered for the open findings (``fix_index.offer_views``)."""
    submissions = submissions or {}
    if state["status"] in ("done", "aborted"):
        return ["nothing: the run is finished"]
    if state["awaiting"] == "human":
        return ["stop: a person answers with `orchestrator resume`", "you may add a note for them"]
    steps = []
    if state["violations"]:
        steps.append("undo the edits the rule names (write_file / apply_diff the original back), then advance")
    for offer in offers:
        proven = ", ".join(p["run_id"] for p in offer["proven_by"])
        steps.append(f"{', '.join(offer['for'])}: a proven fix is offered ({offer['offer']}, proven by {proven}; "
                     f"{'applies cleanly' if offer['applies_cleanly'] else 'does NOT apply cleanly here'}): "
                     f"{offer['how']}")
    for issue in state["issues"]:
        where = f" in {issue['fix_location']}" if issue.get("fix_location") else ""
        steps.append(f"fix {issue['code']}{where}")
    if state["issues"] and spec is not None and not spec.allowed_paths:
        steps.append(f"this phase takes no file edits: submit kind={' or '.join(submissions)} (schema under "
                     "submissions)" if submissions else "this phase takes no file edits")
        steps.append(f"if nothing you can submit clears a finding, stop and say so: a person can waive it "
                     f"(`orchestrator resume {state['run_id']} --waive CODE --reason TEXT`) or abort the run")
    steps.append(last_step(state, submissions))
    return steps


def last_step(state: dict[str, Any], submissions: Mapping[str, Any]) -> str:
    """The call that moves the phase on: advance, unless it has run and waits for a submission that runs it."""
    if not state["attempts"].get(state["phase"], 0):
        return "call advance to run the phase"
    driving = [kind for kind, row in submissions.items() if row.drive]
    if not driving:
        return "call advance to re-run the phase"
    takes_branch = any("branch" in submissions[kind].args.model_fields for kind in driving)
    first = "commit_branch your edits, then " if takes_branch else ""
    return (f"{first}submit kind={' or '.join(driving)} (schema under submissions): the submission re-runs the "
            "phase; advance without one waits again")


def shrink(value: Any, *, limit: int = 8000, items: int = 20, chars: int = 1500) -> Any:
    """``value`` as JSON objects that fit about ``limit`` characters: long lists keep their first
    ``items`` (then one {"omitted": N} entry), long strings their head; never one escaped string."""
    if len(json.dumps(value, default=str)) <= limit:
        return value
    while items >= 1:
        small = _shrunk(value, items=items, chars=chars)
        if len(json.dumps(small, default=str)) <= limit:
            return small
        items, chars = items // 2, chars // 2
    return {"keys": sorted(value) if isinstance(value, dict) else [], "omitted": "too large; read the artifacts"}


def _shrunk(value: Any, *, items: int, chars: int) -> Any:
    if isinstance(value, dict):
        return {k: _shrunk(v, items=items, chars=chars) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        head = [_shrunk(v, items=items, chars=chars) for v in value[:items]]
        return head + ([{"omitted": len(value) - items}] if len(value) > items else [])
    if isinstance(value, str) and len(value) > chars:
        return value[:chars] + f"... ({len(value) - chars} more chars)"
    return value


def outcome_so_far(state: dict[str, Any], *, last: int = 5) -> dict[str, Any]:
    """Each record kind of the run (verdicts, stack entries, measured rows): its count and latest ones."""
    return {kind: {"count": len(rows), "latest": shrink(rows[-last:], limit=4000)}
            for kind, rows in sorted(state["records"].items()) if rows}


def scope_for(state: dict[str, Any]) -> files.Scope:
    """What an agent may edit in the run's current phase (its allowed paths, less the frozen ones)."""
    from pathlib import Path

    spec = phase_spec(state)
    allowed = spec.allowed_paths if spec is not None else ()
    return files.Scope(target=Path(state["target"]), phase=state["phase"], allowed_paths=tuple(allowed),
                       frozen=_workflow_frozen(state))


def _workflow_frozen(state: dict[str, Any]) -> tuple[str, ...]:
    from orchestrator.workflow import load_workflow

    try:
        return tuple(load_workflow(state["workflow"]).frozen)
    except OrchestratorError:
        return ()


def phase_spec(state: dict[str, Any]) -> Any:
    """The table row of the run's current phase (None when it waits in none)."""
    from orchestrator.workflow import load_workflow

    workflow = load_workflow(state["workflow"])
    return next((p for p in workflow.phases if p.name == state["phase"]), None)


def live_state(store: Any, run_id: str) -> dict[str, Any]:
    """The run's state; RunIsFinished when it is done or aborted."""
    state = store.read_state(run_id)
    if state["status"] in ("done", "aborted"):
        raise RunIsFinished(f"run {run_id} is {state['status']}; start a new run instead")
    return state


def submission_schemas(workflow: Any, phase: str) -> dict[str, Any]:
    """The submission rows the phase takes: kind -> what it is, its fields' JSON schema (for ``submit``)
    and the phases the call may run before it returns (the phase and those after it in the table)."""
    names = [p.name for p in workflow.phases]
    return {kind: {"description": " ".join((row.args.__doc__ or kind).split()),
                   "args_schema": row.args.model_json_schema(union_format="primitive_type_array"),
                   "may_run_phases": names[names.index(phase):] if row.drive else []}
            for kind, row in workflow.submissions.items() if row.phase == phase}
