"""A person's waiver of a finding: the way past a finding that no fix in scope can clear.

``orchestrator resume RUN --waive CODE --reason TEXT`` records the waiver as a human answer
keyed ``waive:<phase>:<code>`` with the reason as its value (nothing new for an auditor to
parse: an ``answer_accepted`` by actor human). From then on the engine drops that code from
the phase's findings: a phase whose every finding is waived passes, with the waivers in its
data (``waived``: code -> reason) and summary, so reports and docs show them. Only a person
may waive (an agent's waiver is refused), only a finding the phase now reports, and never
without a reason; audit's meaning rules check all three.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from orchestrator.errors import BadAnswer

PREFIX = "waive:"


def waiver_key(phase: str, code: str) -> str:
    return f"{PREFIX}{phase}:{code}"


def parse_key(key: str) -> tuple[str, str] | None:
    """(phase, code) of a waiver key, None for any other answer key."""
    if not key.startswith(PREFIX):
        return None
    phase, _, code = key[len(PREFIX):].partition(":")
    return (phase, code) if phase and code else None


def waived_codes(state: dict[str, Any], phase: str) -> dict[str, str]:
    """Code -> reason of every finding of ``phase`` a person waived."""
    found = {}
    for key, reason in state["answers"].items():
        parsed = parse_key(key)
        if parsed is not None and parsed[0] == phase:
            found[parsed[1]] = str(reason)
    return found


def unapplied_waivers(state: dict[str, Any]) -> list[str]:
    """Codes a person waived that the current phase still reports: it has not run since the waiver."""
    waived = waived_codes(state, state["phase"])
    return [issue["code"] for issue in state["issues"] if issue["code"] in waived]


def validate_waiver(state: dict[str, Any], code: str, reason: str, *, actor: str) -> str:
    """The answer key of a valid waiver; BadAnswer (nothing written) for an invalid one."""
    run_id, phase = state["run_id"], state["phase"]
    if actor != "human":
        raise BadAnswer(f"only a person may waive a finding; ask one: `orchestrator resume {run_id} "
                        f"--waive {code} --reason TEXT`")
    if not reason.strip():
        raise BadAnswer(f"a waiver needs a reason: --waive {code} --reason TEXT")
    current = [issue["code"] for issue in state["issues"]]
    if code not in current:
        raise BadAnswer(f"{phase} reports no finding {code!r} to waive (its findings: {', '.join(current) or 'none'})")
    return waiver_key(phase, code)


def apply_waivers(result: Any, waived: dict[str, str]) -> Any:
    """``result`` without the waived findings; passed when a person waived every one of them."""
    gone = [issue.code for issue in result.issues if issue.code in waived]
    if result.outcome not in ("needs_agent", "needs_human") or not gone:
        return result
    kept = tuple(issue for issue in result.issues if issue.code not in waived)
    data = {**result.data, "waived": {code: waived[code] for code in gone}}
    if kept:
        return dataclasses.replace(result, issues=kept, data=data)
    return dataclasses.replace(result, outcome="passed", issues=(), questions=(), data=data,
                               summary=f"{result.summary} (waived by a person: {', '.join(gone)})")
