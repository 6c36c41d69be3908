"""The documented shape of run.json (pydantic, for JSON Schema generation and tests).

``snapshot.empty_state`` builds the same shape as a plain dict; a test keeps them equal.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from orchestrator.trail.chain import GENESIS_HASH, SCHEMA_VERSION

Status = Literal["running", "waiting", "failed", "done", "aborted"]


class RunSnapshot(BaseModel):
    """The state of one run, equal to replaying its events.jsonl."""

    schema_version: int = SCHEMA_VERSION
    run_id: str
    workflow: str
    target: str
    """Absolute path of the target repository."""
    options: dict[str, Any] = Field(default_factory=dict)
    base: dict[str, Any] = Field(default_factory=dict)
    """Target commit, branch and porcelain status captured at start."""
    phase: str
    """Current state of the machine: a phase name, or "done"."""
    status: Status = "running"
    awaiting: Literal["human", "agent", "job"] | None = None
    pending: list[dict[str, Any]] = Field(default_factory=list)
    """Unanswered questions: key, prompt, choices, answer_schema, human_only."""
    issues: list[dict[str, Any]] = Field(default_factory=list)
    """What the agent must fix before the current phase can pass."""
    answers: dict[str, Any] = Field(default_factory=dict)
    """Answers to the workflow's questions (the phases read these)."""
    agent_asked: list[str] = Field(default_factory=list)
    """Keys of pending questions an agent asked (escalate)."""
    agent_answers: dict[str, Any] = Field(default_factory=dict)
    """Answers to questions an agent asked: kept apart, so they never answer a workflow question."""
    results: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Latest completed ``data`` of each phase."""
    attempts: dict[str, int] = Field(default_factory=dict)
    in_flight: str | None = None
    """Phase started and not yet completed (set while running, or after a crash)."""
    summary: str = ""
    violations: list[dict[str, Any]] = Field(default_factory=list)
    """Open guard violations: guard, message, paths, seq."""
    artifacts: dict[str, str] = Field(default_factory=dict)
    """Artifact name -> sha256 of its latest version."""
    open_patches: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Temporary patches applied and not yet reverted, by patch id."""
    records: dict[str, list[dict[str, Any]]] = Field(default_factory=dict)
    """Workflow-specific records by kind (gap rows, candidates, ...)."""
    measurements: int = 0
    created_at: str = ""
    updated_at: str = ""
    last_seq: int = -1
    chain_head: str = GENESIS_HASH


