"""What the agent tools answer about a run: the status line, why it waits, the next steps."""

from __future__ import annotations

import json
from typing import Any

from orchestrator.agent.tool_args import Status, ToolResult


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



def why_waiting(state: dict[str, Any]) -> str:
    if state["status"] in ("done", "aborted"):
        return f"the run is {state['status']}: {state['summary']}"
    if state["violations"]:
        return "a rule is broken: " + "; ".join(f"{v['guard']}: {v['message']}" for v in state["violations"])
    if state["awaiting"] == "human":
        return "waiting for a human to answer: " + ", ".join(q["key"] for q in state["pending"])
    if state["awaiting"] == "agent":
        codes = ", ".join(i["code"] for i in state["issues"]) or "see pending questions"
        return f"phase {state['phase']} needs the agent: {codes}"
    if state["status"] == "failed":
        return f"phase {state['phase']} failed: {state['summary']}"
    return f"phase {state['phase']} is ready to run; call advance"


def next_steps(state: dict[str, Any], spec: Any) -> list[str]:
    if state["status"] in ("done", "aborted"):
        return ["nothing: the run is finished"]
    if state["awaiting"] == "human":
        return ["stop: a person answers with `orchestrator resume`", "you may add a note for them"]
    steps = []
    if state["violations"]:
        steps.append("undo the edits the rule names (write_file / apply_diff the original back), then advance")
    for issue in state["issues"]:
        where = f" in {issue['fix_location']}" if issue.get("fix_location") else ""
        steps.append(f"fix {issue['code']}{where}")
    if state["issues"] and spec is not None and not spec.allowed_paths:
        steps.append("this phase allows no edits: escalate if a code change is needed")
    steps.append("call advance to re-run the phase")
    return steps


def clip(value: Any, limit: int = 8000) -> Any:
    text = json.dumps(value, sort_keys=True, default=str)
    if len(text) <= limit:
        return value
    return {"truncated": True, "json_head": text[:limit], "hint": "read the phase's artifacts for the full findings"}
