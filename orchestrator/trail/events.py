"""Event models: the trail's vocabulary, one discriminated union on ``type``.

Every line of ``events.jsonl`` is an envelope (seq, ts, run_id, type, actor, phase, data,
prev_hash, hash, schema_version; signed_head on a write's first line) whose ``data`` is typed
by ``type``. Names are past tense: an event states what happened, never what should. The hash
chain is
``hash = sha256(prev_hash + canonical_json(event without "hash" and "signed_head"))``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from orchestrator.trail.chain import GENESIS_HASH, SCHEMA_VERSION, canonical_json, chain_hash
from orchestrator.trail.edit_events import (ClearedFinding, EditRecorded, FindingRef, FindingsCleared, FixOffered,
                                            FixProof)
from orchestrator.trail.event_body import EventBody as _Data

Actor = Literal["engine", "agent", "human"]
__all__ = ["GENESIS_HASH", "SCHEMA_VERSION", "canonical_json", "chain_hash", "ClearedFinding", "EditRecorded",
           "FindingRef", "FindingsCleared", "FixOffered", "FixProof"]


class IssueData(_Data):
    code: str
    """Stable snake_case id of the problem."""
    message: str
    """What is wrong, naming the culprit."""
    fix_location: str = ""
    """Where the skill says the fix goes."""


class QuestionData(_Data):
    key: str
    """Answer key, unique among pending questions."""
    prompt: str
    """The question as a person reads it."""
    choices: list[str] | None = None
    """Allowed answers; None means free text checked against ``schema``."""
    answer_schema: dict[str, Any] | None = None
    """JSON Schema the answer must satisfy, if any."""
    human_only: bool = True
    """Only a human may answer (agent tools refuse)."""


class InputFile(_Data):
    """One file a start option named (``orchestrator.inputs``)."""

    options: list[str]
    """The start options that name it, e.g. ["model", "model_id"]."""
    path: str
    """Where it was: relative to the state dir when inside it, else absolute (a path of the machine that ran it)."""
    bytes: int | None
    sha256: str | None
    """Of its content when it was read; None when it was not hashed (``note`` says why)."""
    artifact: str | None = None
    """The artifact that keeps its bytes in the state dir (small files), e.g. "inputs/model/config.json"."""
    note: str = ""
    """What was not done with it (not hashed, not kept, files not listed), or ""."""


class RunStarted(_Data):
    type: Literal["run_started"] = "run_started"
    workflow: str
    """Workflow name, e.g. "add-moe-model"."""
    target: str
    """The target git checkout: relative to the state dir when it lies inside it (an embedded workspace,
    "workspaces/..."; read back against the state dir it is read from), else absolute. Runs made before
    recorded every target absolute."""
    options: dict[str, Any]
    """Validated start options, as given (paths in them are those of the machine that ran the run)."""
    inputs: list[InputFile] | None = None
    """Every file a start option named, with its sha256 (None in runs made before inputs were recorded)."""
    base: dict[str, Any]
    """Target state before any edit: commit, branch, status (porcelain lines)."""
    initial_phase: str
    """The phase the machine starts in."""
    signer: dict[str, Any] | None = None
    """The public key that signs this run's heads: {algorithm, public_key (hex), holder}; None in legacy runs."""
    heads: Literal["in_log"] | None = None
    """"in_log": each write's first line carries its signed head (``signed_head``); None: runs made before,
    whose heads live in the anchor file alone."""


class PhaseStarted(_Data):
    type: Literal["phase_started"] = "phase_started"
    attempt: int
    """1 for the first try of this phase, then 2, 3, ..."""


class PhaseInterrupted(_Data):
    type: Literal["phase_interrupted"] = "phase_interrupted"
    attempt: int
    """The attempt that started but never completed (the process died)."""
    action: Literal["rerun", "reconcile"]
    """What the engine does about it: run the phase again, or let it reconcile."""


class PhaseCompleted(_Data):
    type: Literal["phase_completed"] = "phase_completed"
    attempt: int
    outcome: Literal["passed", "needs_agent", "needs_human", "waiting_job", "failed"]
    summary: str
    """One line for status."""
    data: dict[str, Any] = Field(default_factory=dict)
    """The phase's findings; later phases read them."""
    issues: list[IssueData] = Field(default_factory=list)
    route: str = "next"
    """The declared edge taken when passed."""


class TransitionTaken(_Data):
    type: Literal["transition_taken"] = "transition_taken"
    source: str
    dest: str
    trigger: str


class GateBlocked(_Data):
    type: Literal["gate_blocked"] = "gate_blocked"
    dest: str
    """The phase that could not be entered."""
    reasons: list[str]


class GuardViolated(_Data):
    type: Literal["guard_violated"] = "guard_violated"
    guard: str
    message: str
    paths: list[str] = Field(default_factory=list)


class GuardCleared(_Data):
    type: Literal["guard_cleared"] = "guard_cleared"
    guard: str


class QuestionAsked(QuestionData):
    type: Literal["question_asked"] = "question_asked"


class AnswerAccepted(_Data):
    type: Literal["answer_accepted"] = "answer_accepted"
    key: str
    value: Any
    tool_call_id: str | None = None
    """Set when an agent answered through a tool call."""


class ArtifactWritten(_Data):
    type: Literal["artifact_written"] = "artifact_written"
    name: str
    """Path under artifacts/."""
    sha256: str
    bytes: int


class MeasurementRecorded(_Data):
    type: Literal["measurement_recorded"] = "measurement_recorded"
    name: str
    """Metric id, e.g. "kl_div" or "wall_ms"."""
    unit: str
    samples: list[float]
    """Raw values in ``unit``; never only a median."""
    labels: dict[str, Any] = Field(default_factory=dict)
    """What was measured: tree, tokens, dtype, ..."""
    provenance: dict[str, Any]
    """Command, device, versions, target commit, seed."""


class NoteAdded(_Data):
    type: Literal["note_added"] = "note_added"
    kind: str
    """devlog, decision, dead_end, skill_feedback, ..."""
    text: str


class WorkerFinished(_Data):
    type: Literal["worker_finished"] = "worker_finished"
    func: str
    label: str
    status: Literal["ok", "failed", "timeout"]
    returncode: int | None
    seconds: float
    log: str
    """Artifact name of the captured stdout+stderr."""


class AgentActed(_Data):
    type: Literal["agent_acted"] = "agent_acted"
    tool: str
    call_id: str
    arguments: dict[str, Any]
    outcome: str
    """ok, refused: <why>, error: <why>."""


class PatchApplied(_Data):
    type: Literal["patch_applied"] = "patch_applied"
    patch_id: str
    label: str
    diff: str
    """Artifact name of the diff."""
    files: dict[str, dict[str, str | None]]
    """Path -> {"before": blob sha or None, "after": blob sha or None}."""


class PatchReverted(_Data):
    type: Literal["patch_reverted"] = "patch_reverted"
    patch_ids: list[str]
    files: dict[str, str | None]
    """Path -> blob sha after the revert (must equal the base)."""


class RecordAdded(_Data):
    type: Literal["record_added"] = "record_added"
    kind: str
    """Workflow-specific record kind, e.g. "gap_row" or "candidate"."""
    record: dict[str, Any]


class RunAborted(_Data):
    type: Literal["run_aborted"] = "run_aborted"
    reason: str


class RunFinished(_Data):
    type: Literal["run_finished"] = "run_finished"
    summary: str


class CommandInterrupted(_Data):
    type: Literal["command_interrupted"] = "command_interrupted"
    signal: str
    """SIGTERM or SIGINT: the CLI was stopped; its worker's process group was killed."""
    command_phase: str | None = None
    """The phase that was running (it stays in flight: the next advance reruns or reconciles it)."""


class TrailRepaired(_Data):
    type: Literal["trail_repaired"] = "trail_repaired"
    lost_seqs: list[int]
    """Seqs of the write that never fully landed (the anchor had announced them)."""
    dropped_lines: int
    """Complete lines of that write that were cut off again."""
    torn_bytes: int
    """Bytes of a torn last line that were cut off."""


EventData = Annotated[
    Union[
        RunStarted, PhaseStarted, PhaseInterrupted, PhaseCompleted, TransitionTaken,
        GateBlocked, GuardViolated, GuardCleared, QuestionAsked, AnswerAccepted,
        ArtifactWritten, MeasurementRecorded, NoteAdded, WorkerFinished, AgentActed,
        PatchApplied, PatchReverted, RecordAdded, RunAborted, RunFinished, CommandInterrupted,
        TrailRepaired, EditRecorded, FindingsCleared, FixOffered,
    ],
    Field(discriminator="type"),
]


class McpClient(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    version: str


class Who(BaseModel):
    """Who made an event (``identity``): what the writing process says of itself; nothing authenticates it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["person", "agent"]
    as_name: str | None = Field(default=None, alias="as")
    """A person's name as given with ``--as NAME`` (or ORCHESTRATOR_AS); absent when none was given."""
    via: Literal["mcp", "anthropic", "tools"] | None = None
    """An agent's way in: an MCP client, our Anthropic loop, or in-process tool calls that named no client."""
    client: McpClient | None = None
    """The MCP client's name and version, as its initialize request (clientInfo) gave them."""
    model: str | None = None
    """The model our Anthropic loop asked."""
    user: str
    """The OS user the process ran as."""
    host: str
    pid: int
    tty: bool
    """Whether the process's stdin was a terminal."""
    command: str
    """The process's command line (the CLI's as ``orchestrator ...``), clipped to 300 characters."""
    parent: str | None
    """The parent process's command line (a shell, a script, an agent's harness); None where it could not be read."""


class SignedHead(BaseModel):
    """Where the write this line starts ends, and the Ed25519 signature of that head (state/README.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seq: int | None = None
    """The seq of the write's last line; left out (with ``hash``) when the write is this line alone."""
    hash: str | None = None
    sig: str


class Event(BaseModel):
    """One line of events.jsonl."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = SCHEMA_VERSION
    seq: int
    """0, 1, 2, ... with no gaps."""
    ts: str
    """UTC ISO-8601 time the engine appended the event."""
    run_id: str
    type: str
    """Equals data.type."""
    actor: Actor
    who: Who | None = None
    """Who acted, on every event by a person or an agent (self-reported by the process that wrote it); left
    out of the engine's own events and of events made before it was recorded."""
    phase: str | None
    """Phase the event belongs to, or None for run-level events."""
    data: EventData
    prev_hash: str
    """Hash of the previous event; 64 zeros for the first."""
    hash: str
    signed_head: SignedHead | None = None
    """On the first line of each write of a run with in-log heads; left out of the chain hash."""


EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)
DATA_TYPES: dict[str, type[_Data]] = {
    cls.model_fields["type"].default: cls
    for cls in _Data.__subclasses__()
    if "type" in cls.model_fields
} | {"question_asked": QuestionAsked}
