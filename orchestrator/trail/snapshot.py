"""run.json: the run's state, derived from the events and from nothing else.

``replay(events)`` folds the trail into a ``RunSnapshot``; the store keeps the same fold
incrementally and writes it atomically; ``audit`` recomputes it and compares. The reducer
works on plain dicts (the parsed lines) so that auditing a long trail stays fast, and
imports no pydantic so that ``status`` starts fast; the documented model of run.json is
``snapshot_schema.RunSnapshot``.
"""

from __future__ import annotations

from typing import Any, Iterable

from orchestrator.errors import EXIT_AGENT, EXIT_FAILED, EXIT_HUMAN, EXIT_JOB, EXIT_OK

TERMINAL: frozenset[str] = frozenset({"done", "aborted"})


def _run_started(s: dict[str, Any], d: dict[str, Any], ev: dict[str, Any]) -> None:
    s.update(workflow=d["workflow"], target=d["target"], options=d["options"], base=d["base"])
    s["phase"] = d["initial_phase"]
    s["created_at"] = ev["ts"]


def _phase_started(s: dict[str, Any], d: dict[str, Any], ev: dict[str, Any]) -> None:
    s["in_flight"] = ev["phase"]
    s["attempts"][ev["phase"]] = d["attempt"]
    s["status"], s["awaiting"], s["issues"] = "running", None, []


def _phase_interrupted(s: dict[str, Any], d: dict[str, Any], ev: dict[str, Any]) -> None:
    s["in_flight"] = None


def _phase_completed(s: dict[str, Any], d: dict[str, Any], ev: dict[str, Any]) -> None:
    s["in_flight"] = None
    s["summary"] = d["summary"]
    s["issues"] = list(d.get("issues", []))
    outcome = d["outcome"]
    if outcome == "passed":
        s["results"][ev["phase"]] = d.get("data", {})
        s["status"], s["awaiting"] = "running", None
    elif outcome == "needs_agent":
        s["results"][ev["phase"]] = d.get("data", {})
        s["status"], s["awaiting"] = "waiting", "agent"
    elif outcome == "needs_human":
        s["results"][ev["phase"]] = d.get("data", {})
        s["status"], s["awaiting"] = "waiting", "human"
    elif outcome == "waiting_job":
        s["results"][ev["phase"]] = d.get("data", {})
        s["status"], s["awaiting"] = "waiting", "job"
    else:
        s["status"], s["awaiting"] = "failed", None


def _transition_taken(s: dict[str, Any], d: dict[str, Any], ev: dict[str, Any]) -> None:
    s["phase"] = d["dest"]


def _gate_blocked(s: dict[str, Any], d: dict[str, Any], ev: dict[str, Any]) -> None:
    s["status"], s["awaiting"] = "failed", None
    s["summary"] = f"cannot enter {d['dest']}: " + "; ".join(d["reasons"])


def _guard_violated(s: dict[str, Any], d: dict[str, Any], ev: dict[str, Any]) -> None:
    s["violations"] = [v for v in s["violations"] if v["guard"] != d["guard"]]
    s["violations"].append({**d, "seq": ev["seq"]})


def _guard_cleared(s: dict[str, Any], d: dict[str, Any], ev: dict[str, Any]) -> None:
    s["violations"] = [v for v in s["violations"] if v["guard"] != d["guard"]]


def _question_asked(s: dict[str, Any], d: dict[str, Any], ev: dict[str, Any]) -> None:
    question = {k: v for k, v in d.items() if k != "type"}
    s["pending"] = [q for q in s["pending"] if q["key"] != d["key"]] + [question]
    # NOTE: an agent's question is answered into agent_answers, never into the answers the phases
    # read, so it cannot pre-answer or shadow a question the workflow asks (that one replaces it).
    s["agent_asked"] = [k for k in s["agent_asked"] if k != d["key"]] + ([d["key"]] if ev["actor"] == "agent" else [])
    s["status"] = "waiting"
    s["awaiting"] = "human" if any(q["human_only"] for q in s["pending"]) else s["awaiting"] or "agent"


def _answer_accepted(s: dict[str, Any], d: dict[str, Any], ev: dict[str, Any]) -> None:
    if d["key"] in s["agent_asked"]:
        s["agent_asked"] = [k for k in s["agent_asked"] if k != d["key"]]
        s["agent_answers"][d["key"]] = d["value"]
    else:
        s["answers"][d["key"]] = d["value"]
    s["pending"] = [q for q in s["pending"] if q["key"] != d["key"]]
    if not s["pending"] and s["status"] == "waiting" and s["awaiting"] == "human":
        s["status"], s["awaiting"] = "running", None


def _artifact_written(s: dict[str, Any], d: dict[str, Any], ev: dict[str, Any]) -> None:
    s["artifacts"][d["name"]] = d["sha256"]


def _measurement_recorded(s: dict[str, Any], d: dict[str, Any], ev: dict[str, Any]) -> None:
    s["measurements"] += 1


def _patch_applied(s: dict[str, Any], d: dict[str, Any], ev: dict[str, Any]) -> None:
    s["open_patches"][d["patch_id"]] = {"label": d["label"], "files": d["files"], "seq": ev["seq"]}


def _patch_reverted(s: dict[str, Any], d: dict[str, Any], ev: dict[str, Any]) -> None:
    for patch_id in d["patch_ids"]:
        s["open_patches"].pop(patch_id, None)


def _record_added(s: dict[str, Any], d: dict[str, Any], ev: dict[str, Any]) -> None:
    s["records"].setdefault(d["kind"], []).append(d["record"])


def _run_aborted(s: dict[str, Any], d: dict[str, Any], ev: dict[str, Any]) -> None:
    s["status"], s["awaiting"], s["pending"] = "aborted", None, []
    s["summary"] = f"aborted: {d['reason']}"


def _run_finished(s: dict[str, Any], d: dict[str, Any], ev: dict[str, Any]) -> None:
    s["status"], s["awaiting"], s["summary"] = "done", None, d["summary"]


_REDUCERS = {
    "run_started": _run_started,
    "phase_started": _phase_started,
    "phase_interrupted": _phase_interrupted,
    "phase_completed": _phase_completed,
    "transition_taken": _transition_taken,
    "gate_blocked": _gate_blocked,
    "guard_violated": _guard_violated,
    "guard_cleared": _guard_cleared,
    "question_asked": _question_asked,
    "answer_accepted": _answer_accepted,
    "artifact_written": _artifact_written,
    "measurement_recorded": _measurement_recorded,
    "patch_applied": _patch_applied,
    "patch_reverted": _patch_reverted,
    "record_added": _record_added,
    "run_aborted": _run_aborted,
    "run_finished": _run_finished,
}


def empty_state(run_id: str) -> dict[str, Any]:
    """The snapshot before any event (the shape ``snapshot_schema.RunSnapshot`` documents)."""
    from orchestrator.trail.chain import GENESIS_HASH, SCHEMA_VERSION  # here: ``status`` loads no hashlib

    return {
        "schema_version": SCHEMA_VERSION, "run_id": run_id, "workflow": "", "target": "", "options": {},
        "base": {}, "phase": "", "status": "running", "awaiting": None, "pending": [], "issues": [],
        "answers": {}, "agent_asked": [], "agent_answers": {}, "results": {}, "attempts": {}, "in_flight": None,
        "summary": "", "violations": [],
        "artifacts": {}, "open_patches": {}, "records": {}, "measurements": 0, "created_at": "",
        "updated_at": "", "last_seq": -1, "chain_head": GENESIS_HASH,
    }


def apply_event(state: dict[str, Any], event: dict[str, Any]) -> None:
    """Fold one event (a parsed line) into ``state`` in place."""
    reducer = _REDUCERS.get(event["type"])
    if reducer is not None:
        reducer(state, event["data"], event)
    state["last_seq"] = event["seq"]
    state["chain_head"] = event["hash"]
    state["updated_at"] = event["ts"]


def replay(events: Iterable[dict[str, Any]], *, run_id: str) -> dict[str, Any]:
    """Fold a whole trail into the snapshot dict that run.json must equal."""
    state = empty_state(run_id)
    for event in events:
        apply_event(state, event)
    return state


def exit_code_for(state: dict[str, Any]) -> int:
    """Exit code of a run's state: 0 done/progressed, 1 failed or rule broken, 3 human, 4 agent, 5 a cluster job."""
    if state["violations"] or state["status"] == "failed":
        return EXIT_FAILED
    if state["awaiting"] == "human":
        return EXIT_HUMAN
    if state["awaiting"] == "agent":
        return EXIT_AGENT
    if state["awaiting"] == "job":
        return EXIT_JOB
    return EXIT_OK
