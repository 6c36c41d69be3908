"""Answers to a run's pending questions: parsed and checked against the question before anything is recorded."""

from __future__ import annotations

from typing import Any

from orchestrator.errors import BadAnswer


def validate_answer(state: dict[str, Any], key: str, raw: str, *, actor: str) -> Any:
    """Parse and check one answer against its pending question; BadAnswer if it does not fit."""
    question = next((q for q in state["pending"] if q["key"] == key), None)
    if question is None:
        pending = ", ".join(q["key"] for q in state["pending"]) or "none"
        raise BadAnswer(f"no pending question {key!r} in run {state['run_id']} (pending: {pending})")
    if question["human_only"] and actor != "human":
        raise BadAnswer(f"question {key!r} is for a human only; the run stays paused until one answers "
                        f"with `orchestrator resume {state['run_id']} --answer {key}=...`")
    if question.get("choices"):
        if raw not in question["choices"]:
            raise BadAnswer(f"answer {key}={raw!r} is not one of: {', '.join(question['choices'])}")
        return raw
    if question.get("answer_schema"):
        return _validate_schema_answer(key, raw, question["answer_schema"])
    return raw


def _validate_schema_answer(key: str, raw: str, schema: dict[str, Any]) -> Any:
    import json

    import jsonschema

    value: Any = raw
    if schema.get("type") != "string":
        try:
            value = json.loads(raw)
        except ValueError:
            raise BadAnswer(f"answer {key}={raw!r} must be JSON matching its schema") from None
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as exc:
        raise BadAnswer(f"answer {key}={raw!r} does not fit its schema: {exc.message}") from None
    return value
