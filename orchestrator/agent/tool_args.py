"""Argument and result models of the agent tools (their JSON Schemas are what models read).

Each docstring is the tool's description; optional fields have defaults so that the schemas
(``union_format="primitive_type_array"``) never contain ``anyOf``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.agent import files

Status = Literal["ok", "refused", "waiting_for_human", "error"]


class ToolResult(BaseModel):
    """What every tool answers (sent to the model as JSON text)."""

    status: Status
    message: str
    data: dict[str, Any] = Field(default_factory=dict)
    text: str | None = Field(default=None, exclude=True)
    """A file's or artifact's text, sent as its own plain-text block after the JSON answer."""

    @property
    def is_error(self) -> bool:
        return self.status in ("refused", "error")

    def blocks(self) -> list[str]:
        """The answer as text blocks: the JSON answer, then the plain text when there is one."""
        return [self.model_dump_json()] + ([self.text] if self.text is not None else [])

    def outcome(self) -> str:
        """The ``AgentActed.outcome`` line: ok, waiting for a human, refused: <why>, error: <why>."""
        if self.status == "ok":
            return "ok"
        if self.status == "waiting_for_human":
            return "waiting for a human"
        kind = "error" if self.status == "error" else "refused"
        return f"{kind}: {self.message}"


class ToolArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class RunArgs(ToolArgs):
    run_id: str
    """The run's id, as returned by start_run or list_runs."""


class StartRunArgs(ToolArgs):
    """Start a new run of a workflow (does not advance it; call advance next). The options are the
    workflow's start options, e.g. {"target": "/abs/path/to/checkout"}; list_runs names the known workflows."""

    workflow: str
    """Workflow name, e.g. "add-moe-model" or "local-compile-perf"."""
    options: dict[str, Any] = Field(default_factory=dict)
    """The workflow's options as a JSON object, e.g. {"target": "/abs/path", "model": "..."}."""


class StatusArgs(RunArgs):
    """The run's phase, status, what it waits for, pending questions and open issues."""


class AdvanceArgs(RunArgs):
    """Run the current phase once (at most one phase per call) and report where the run stands.
    Call it after each fix; repeat while status stays ok and the run is not done. A phase may
    run for minutes (local-compile-perf's baselines and findings, add-moe-model's numerics and
    parallelism); its progress comes as MCP progress notifications (send a progress token)."""


class ListRunsArgs(ToolArgs):
    """List every run in the state directory (one line each) and the workflows that can be started."""


class ReadArtifactArgs(RunArgs):
    """Read an artifact the run recorded (reports, worker logs, tables) by its name under artifacts/.
    The answer's first block is JSON (name, total_chars, next_offset); the text follows as plain text."""

    name: str
    """Artifact name as listed by explain, e.g. "logs/000012-probe-square.log"."""
    offset: int = Field(default=0, ge=0)
    """Character offset to start from (for long artifacts)."""
    max_chars: int = Field(default=20000, ge=1, le=files.MAX_READ_CHARS)
    """How many characters to return at most."""


class ExplainArgs(RunArgs):
    """Why the run waits, what the current phase found (phase_findings, JSON), the outcome so far
    (outcome: each record kind's count and latest rows, e.g. candidate verdicts and the stack),
    where the skill says each fix goes, which paths may be edited now, the skill's rules for
    this phase, and fix_offers: proven fixes for the open findings (the diff an earlier run on the
    same target cleared the same finding with, its run id and event seqs; apply_fix applies one).
    Start here. Reads never wait for a run another process is changing."""


class AnswerArgs(RunArgs):
    """Answer a pending question that is NOT human-only (human-only questions such as branch,
    commit, core changes or PRs are refused: the run waits for a person). Does not advance."""

    key: str
    """The question's key, as listed in pending."""
    value: str
    """The answer; one of the question's choices when it has choices, JSON when its schema asks for it."""


class SubmitArgs(RunArgs):
    """Submit input the run's workflow takes from outside while it waits in a phase: kind "candidate"
    (a branch to measure, local-compile-perf; make it with commit_branch) or "patch" (a temporary
    patch of the gap-analysis ledger, add-moe-model). explain lists the kinds the current phase
    takes, each with its fields' JSON schema and the phases it may run. A submission drives the
    run on until it waits again, in this one call: a candidate runs pick_fix, graph_budget,
    screen_confirm, correctness and commit_scope (minutes on a CPU; a rejection goes back to
    pick_fix), a patch is measured in a fresh process. Progress comes as MCP progress
    notifications (send a progress token); give the call a long timeout (the trail records it either way)."""

    kind: str
    """The submission kind, e.g. "candidate" or "patch"."""
    args: dict[str, Any] = {}
    """The kind's fields, e.g. {"branch": "opt/rope", "label": "real RoPE"} or {"diff": "...", "label": "..."}."""


class RevertPatchesArgs(RunArgs):
    """Revert every open temporary patch of the gap-analysis ledger (add-moe-model)."""


class NoteArgs(RunArgs):
    """Append a note to the run's trail: a devlog entry, feedback on the skill, or a decision and why."""

    kind: Literal["devlog", "skill_feedback", "decision"] = "devlog"
    """devlog (what you did), skill_feedback (where the skill text was wrong or unclear), decision."""
    text: str
    """The note, in a few sentences."""


class EscalateArgs(RunArgs):
    """Ask the human a question. The run then waits for a person (`orchestrator resume`); stop
    working on this run after escalating."""

    question: str
    """The question as a person should read it, with the context needed to answer."""
    key: str = Field(default="", pattern=r"^([a-z][a-z0-9_]{0,63})?$")
    """Answer key (snake_case); empty picks one."""
    choices: list[str] = Field(default_factory=list)
    """Allowed answers; empty for free text."""


class ReadFileArgs(RunArgs):
    """Read a file (or list a directory) of the run's target checkout. The answer's first block is
    JSON (path, total_chars, next_offset); the file's text follows as a second, plain-text block.
    Paths are relative to the target's root; '..', .git and anything outside the target are refused."""

    path: str
    """Path relative to the target's root, e.g. "torchtitan/models/x/model.py"; "." lists the root."""
    offset: int = Field(default=0, ge=0)
    """Character offset to start from."""
    max_chars: int = Field(default=20000, ge=1, le=files.MAX_READ_CHARS)
    """How many characters to return at most."""


class WriteFileArgs(RunArgs):
    """Create or overwrite a file under the current phase's allowed paths (see explain). Anything
    else is refused and recorded."""

    path: str
    """Path relative to the target's root, inside the allowed paths."""
    content: str
    """The complete new content of the file."""


class EditFileArgs(RunArgs):
    """Replace one exact piece of text in a file under the current phase's allowed paths (see
    explain). old_string must match exactly once (copy it from read_file, whitespace included);
    0 or several matches are refused and nothing changes. Use write_file to create a file."""

    path: str
    """Path relative to the target's root, inside the allowed paths."""
    old_string: str
    """The exact text to replace; it must occur once in the file."""
    new_string: str
    """The text that replaces it."""


class CommitBranchArgs(RunArgs):
    """Turn your edits into a new branch of the target with one commit, for a phase that takes a
    branch (local-compile-perf's pick_fix: then submit kind "candidate" with that branch). The
    changed files under the allowed paths are committed on top of HEAD; they are then restored
    in the checkout, so the next candidate starts clean. Refused in phases that take no branch
    (add-moe-model: your edits stay in the checkout and a person decides branch and commit)."""

    branch: str
    """New branch name, e.g. "candidate/fuse-rmsnorm" (must not exist yet)."""
    message: str
    """Commit message: what the change does and why."""


class ApplyDiffArgs(RunArgs):
    """Apply a unified diff (git apply) to the target; every file it touches must be under the
    current phase's allowed paths, or nothing is applied."""

    diff: str
    """Unified diff with a/ and b/ prefixes, relative to the target's root."""


class ApplyFixArgs(RunArgs):
    """Apply a proven fix that explain offers (fix_offers) for an open finding: the diff with which an
    earlier run on the same target cleared the same finding, with that run's id and event seqs as
    evidence. One call applies the whole diff under the same rules as apply_diff (allowed paths only,
    recorded as your act); a diff that does not apply cleanly here is refused, and its text stays
    readable (read_artifact) for you to adapt by hand. You may ignore any offer."""

    offer: str
    """The offer id from explain's fix_offers, e.g. "fix-3fa2b1c9d0e1"."""
