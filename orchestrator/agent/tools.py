"""The agent's tool set, transport-free: pydantic argument models, handlers, one dispatcher.

The MCP server and our own Anthropic loop serve exactly this table (``TOOLS``). A tool's JSON
Schema is its argument model's schema (``union_format="primitive_type_array"``, so optional
fields never become ``anyOf``), its description is the model's docstring, written for a
model to read. ``call_tool`` validates the arguments, runs the handler outside any lock,
then appends one ``AgentActed`` event (actor "agent", the transport's call id) to the run
the call concerned, under that run's lock. Handlers never wait on a person: a question only
a human may answer comes back as ``waiting_for_human`` and the run stays paused; ``advance``
runs at most one phase per call. Engine features that live in other modules (patch
ledger, candidates) are imported when called and reported as unavailable when missing.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.agent import files
from orchestrator.errors import OrchestratorError, RunBusy, RunFinished, UsageError

log = logging.getLogger("orchestrator.agent")
Status = Literal["ok", "refused", "waiting_for_human", "error"]
MAX_RECORDED_CHARS = 2000


class ToolResult(BaseModel):
    """What every tool answers (sent to the model as JSON text)."""

    status: Status
    message: str
    data: dict[str, Any] = Field(default_factory=dict)

    @property
    def is_error(self) -> bool:
        return self.status in ("refused", "error")

    def outcome(self) -> str:
        """The ``AgentActed.outcome`` line: ok, refused: <why>, error: <why>."""
        if self.status == "ok":
            return "ok"
        kind = "error" if self.status == "error" else "refused"
        return f"{kind}: {self.message}"


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class _RunArgs(_Args):
    run_id: str
    """The run's id, as returned by start_run or list_runs."""


class StartRunArgs(_Args):
    """Start a new run of a workflow (does not advance it; call advance next). The options are the
    workflow's start options, e.g. {"target": "/abs/path/to/checkout"}; list_runs names the known workflows."""

    workflow: str
    """Workflow name, e.g. "add-moe-model" or "local-compile-perf"."""
    options: dict[str, Any] = Field(default_factory=dict)
    """The workflow's options as a JSON object, e.g. {"target": "/abs/path", "model": "..."}."""


class StatusArgs(_RunArgs):
    """The run's phase, status, what it waits for, pending questions and open issues."""


class AdvanceArgs(_RunArgs):
    """Run the current phase once (at most one phase per call) and report where the run stands.
    Call it after each fix; repeat while status stays ok and the run is not done."""


class ListRunsArgs(_Args):
    """List every run in the state directory (one line each) and the workflows that can be started."""


class ReadArtifactArgs(_RunArgs):
    """Read an artifact the run recorded (reports, worker logs, tables) by its name under artifacts/."""

    name: str
    """Artifact name as listed by explain, e.g. "logs/000012-probe-square.log"."""
    offset: int = Field(default=0, ge=0)
    """Character offset to start from (for long artifacts)."""
    max_chars: int = Field(default=20000, ge=1, le=files.MAX_READ_CHARS)
    """How many characters to return at most."""


class ExplainArgs(_RunArgs):
    """Why the run waits, what the current phase found, where the skill says each fix goes, which
    paths may be edited now, and the skill's rules for this phase. Start here."""


class AnswerArgs(_RunArgs):
    """Answer a pending question that is NOT human-only (human-only questions such as branch,
    commit, core changes or PRs are refused: the run waits for a person). Does not advance."""

    key: str
    """The question's key, as listed in pending."""
    value: str
    """The answer; one of the question's choices when it has choices, JSON when its schema asks for it."""


class SubmitPatchArgs(_RunArgs):
    """Record and apply a temporary patch in the gap-analysis ledger (add-moe-model). The engine
    applies it, records the blob hashes, and requires it reverted before the run may finish."""

    diff: str
    """Unified diff relative to the target's root."""
    label: str
    """Short label saying what the patch tests, e.g. "skip grouped_mm"."""


class RevertPatchesArgs(_RunArgs):
    """Revert every open temporary patch of the gap-analysis ledger (add-moe-model)."""


class SubmitCandidateArgs(_RunArgs):
    """Submit a candidate optimisation branch for measurement (local-compile-perf)."""

    branch: str
    """Git branch in the target that holds the candidate."""
    label: str
    """Short label for the candidate, e.g. "fuse rmsnorm"."""


class NoteArgs(_RunArgs):
    """Append a note to the run's trail: a devlog entry, feedback on the skill, or a decision and why."""

    kind: Literal["devlog", "skill_feedback", "decision"] = "devlog"
    """devlog (what you did), skill_feedback (where the skill text was wrong or unclear), decision."""
    text: str
    """The note, in a few sentences."""


class EscalateArgs(_RunArgs):
    """Ask the human a question. The run then waits for a person (`orchestrator resume`); stop
    working on this run after escalating."""

    question: str
    """The question as a person should read it, with the context needed to answer."""
    key: str = ""
    """Answer key (snake_case); empty picks one."""
    choices: list[str] = Field(default_factory=list)
    """Allowed answers; empty for free text."""


class ReadFileArgs(_RunArgs):
    """Read a file (or list a directory) of the run's target checkout. Paths are relative to the
    target's root; '..', .git and anything outside the target are refused."""

    path: str
    """Path relative to the target's root, e.g. "torchtitan/models/x/model.py"; "." lists the root."""
    offset: int = Field(default=0, ge=0)
    """Character offset to start from."""
    max_chars: int = Field(default=20000, ge=1, le=files.MAX_READ_CHARS)
    """How many characters to return at most."""


class WriteFileArgs(_RunArgs):
    """Create or overwrite a file under the current phase's allowed paths (see explain). Anything
    else is refused and recorded."""

    path: str
    """Path relative to the target's root, inside the allowed paths."""
    content: str
    """The complete new content of the file."""


class ApplyDiffArgs(_RunArgs):
    """Apply a unified diff (git apply) to the target; every file it touches must be under the
    current phase's allowed paths, or nothing is applied."""

    diff: str
    """Unified diff with a/ and b/ prefixes, relative to the target's root."""


@dataclass(frozen=True, kw_only=True)
class ToolEnv:
    """What a handler may use: the store, the transport's call id, and a progress sink."""

    store: Any
    call_id: str
    progress: Callable[[str], None]


Handler = Callable[[Any, ToolEnv], ToolResult]


@dataclass(frozen=True, kw_only=True)
class ToolSpec:
    name: str
    args: type[_Args]
    handler: Handler

    @property
    def description(self) -> str:
        return " ".join((self.args.__doc__ or self.name).split())

    def input_schema(self) -> dict[str, Any]:
        schema = self.args.model_json_schema(union_format="primitive_type_array")
        schema.pop("description", None)
        schema.pop("title", None)
        return schema


def call_tool(name: str, arguments: dict[str, Any], *, store: Any, call_id: str,
              progress: Callable[[str], None] = lambda _m: None) -> ToolResult:
    """Validate, run and record one tool call; never raises for a refused or failed call."""
    spec = TOOLS.get(name)
    if spec is None:
        return ToolResult(status="error", message=f"unknown tool {name!r}; tools: {', '.join(TOOLS)}")
    run_id = arguments.get("run_id") if isinstance(arguments.get("run_id"), str) else None
    try:
        args = spec.args.model_validate(arguments)
        result = spec.handler(args, ToolEnv(store=store, call_id=call_id, progress=progress))
    except ValidationError as exc:
        result = ToolResult(status="refused", message=f"bad arguments for {name}: " + _errors(exc))
    except OrchestratorError as exc:
        status: Status = "refused" if isinstance(exc, UsageError) and not isinstance(exc, RunBusy) else "error"
        result = ToolResult(status=status, message=exc.message, data={"code": exc.code})
    run_id = result.data.get("run_id", run_id) if name == "start_run" else run_id
    if run_id:
        record_action(store, run_id, tool=name, call_id=call_id, arguments=arguments, outcome=result.outcome())
    return result


def record_action(store: Any, run_id: str, *, tool: str, call_id: str, arguments: dict[str, Any],
                  outcome: str, wait_s: float = 10.0) -> None:
    """Append AgentActed under the run's lock (waiting briefly when a CLI holds it)."""
    from orchestrator import events as ev
    from orchestrator.errors import RunNotFound

    deadline = time.monotonic() + wait_s
    while True:
        try:
            with store.open_run(run_id) as run:
                run.append(ev.AgentActed(tool=tool, call_id=call_id, arguments=_recordable(arguments),
                                         outcome=outcome[:1000]), actor="agent", phase=run.state["phase"] or None)
            return
        except RunNotFound:
            return
        except RunBusy:
            if time.monotonic() > deadline:
                log.warning("could not record %s call %s on run %s: run busy", tool, call_id, run_id)
                return
            time.sleep(0.1)


def _recordable(arguments: dict[str, Any]) -> dict[str, Any]:
    """Arguments as recorded: long strings (file contents, diffs) become their size and sha256."""
    out: dict[str, Any] = {}
    for key, value in arguments.items():
        if isinstance(value, str) and len(value) > MAX_RECORDED_CHARS:
            digest = hashlib.sha256(value.encode("utf-8")).hexdigest()
            value = {"chars": len(value), "sha256": digest, "head": value[:200]}
        out[key] = value
    return json.loads(json.dumps(out, default=str))


def _errors(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in exc.errors())


# --- views -------------------------------------------------------------------------------


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


def _scope(state: dict[str, Any]) -> files.Scope:
    from pathlib import Path

    spec = _phase_spec(state)
    allowed = spec.allowed_paths if spec is not None else ()
    return files.Scope(target=Path(state["target"]), phase=state["phase"], allowed_paths=tuple(allowed))


def _phase_spec(state: dict[str, Any]) -> Any:
    from orchestrator.workflow import load_workflow

    workflow = load_workflow(state["workflow"])
    return next((p for p in workflow.phases if p.name == state["phase"]), None)


def _live_state(store: Any, run_id: str) -> dict[str, Any]:
    state = store.read_state(run_id)
    if state["status"] in ("done", "aborted"):
        raise RunFinished(f"run {run_id} is {state['status']}; start a new run instead")
    return state


__all__ = ["TOOLS", "ToolEnv", "ToolResult", "ToolSpec", "call_tool", "record_action", "state_result"]
