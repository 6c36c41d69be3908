"""The one place that chooses text or JSON for a command's result.

With ``--json`` stdout holds exactly one JSON object (``schema_version`` plus the
command's fields); errors are ``{"error": {"code", "message"}}``. Text goes to stdout,
progress and warnings to stderr.
"""

from __future__ import annotations

import json
import sys
from typing import Any

JSON_SCHEMA_VERSION = 1
STATUS_FIELDS = ("run_id", "workflow", "target", "phase", "status", "awaiting", "pending", "issues",
                 "summary", "violations", "last_seq", "chain_head", "updated_at")


def status_view(state: dict[str, Any]) -> dict[str, Any]:
    """The fields design.md fixes for ``status --json`` (and a few more for people)."""
    return {key: state.get(key) for key in STATUS_FIELDS}


def emit_json(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps({"schema_version": JSON_SCHEMA_VERSION, **payload}, sort_keys=True) + "\n")


def emit_error(code: str, message: str, *, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps({"schema_version": JSON_SCHEMA_VERSION,
                                     "error": {"code": code, "message": message}}, sort_keys=True) + "\n")
    else:
        sys.stderr.write(f"error: {message}\n")


def status_text(state: dict[str, Any]) -> str:
    lines = [
        f"run      {state['run_id']}",
        f"workflow {state['workflow']}   target {state['target']}",
        f"phase    {state['phase']}   status {state['status']}"
        + (f"   waiting for {state['awaiting']}" if state.get("awaiting") else ""),
    ]
    if state.get("summary"):
        lines.append(f"summary  {state['summary']}")
    for violation in state.get("violations") or []:
        lines.append(f"RULE     {violation['guard']}: {violation['message']}")
    for issue in state.get("issues") or []:
        where = f"  [fix in {issue['fix_location']}]" if issue.get("fix_location") else ""
        lines.append(f"issue    {issue['code']}: {issue['message']}{where}")
    for question in state.get("pending") or []:
        choices = f" ({' | '.join(question['choices'])})" if question.get("choices") else ""
        who = "human" if question.get("human_only") else "human or agent"
        lines.append(f"question {question['key']}{choices} [{who}]: {question['prompt']}")
        lines.append(f"         answer: orchestrator resume {state['run_id']} --answer {question['key']}=VALUE")
    return "\n".join(lines)


def runs_table(states: list[dict[str, Any]]) -> str:
    if not states:
        return "no runs"
    rows = [f"{'RUN':44} {'WORKFLOW':20} {'PHASE':20} STATUS"]
    for s in states:
        status = s["status"] + (f" ({s['awaiting']})" if s.get("awaiting") else "")
        if s["status"] == "broken":
            status += f": {s['summary']}"
        rows.append(f"{s['run_id']:44} {s['workflow']:20} {s['phase']:20} {status}")
    return "\n".join(rows)
