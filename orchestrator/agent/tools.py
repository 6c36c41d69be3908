"""The agent's tool set, transport-free: pydantic argument models, handlers, one dispatcher.

The MCP server and our own Anthropic loop serve exactly this table (``TOOLS``). A tool's JSON
Schema is its argument model's schema (``union_format="primitive_type_array"``, so optional
fields never become ``anyOf``), its description is the model's docstring, written for a
model to read. ``call_tool`` validates the arguments, runs the handler outside any lock,
then appends one ``AgentActed`` event (actor "agent", the transport's call id) to the run
the call concerned, under that run's lock. Handlers never wait on a person: a question only
a human may answer comes back as ``waiting_for_human`` and the run stays paused; ``advance``
runs at most one phase per call. ``submit`` serves every submission row of every workflow
(``engine.submit``); ``explain`` lists the rows the current phase takes with their schemas.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

from pydantic import ValidationError

from orchestrator.agent.tool_args import (  # noqa: F401 (re-exported)
    ToolResult,
    ToolArgs,
    RunArgs,
    StartRunArgs,
    StatusArgs,
    AdvanceArgs,
    ListRunsArgs,
    ReadArtifactArgs,
    ExplainArgs,
    AnswerArgs,
    SubmitArgs,
    RevertPatchesArgs,
    NoteArgs,
    EscalateArgs,
    ReadFileArgs,
    WriteFileArgs,
    EditFileArgs,
    CommitBranchArgs,
    ApplyDiffArgs,
    ApplyFixArgs,
    Status,
)
from orchestrator.agent.file_tools import (
    NOT_DONE, apply_diff, apply_fix, commit_branch, edit_file, read_file, write_file,
)
from orchestrator.agent.views import live_state, next_steps, outcome_so_far, phase_spec, shrink
from orchestrator.agent.views import (BUSY_STEP, state_result, submission_schemas, what_a_person_can_do,
                                      why_waiting)
from orchestrator.errors import OrchestratorError, RunBusy, RunIsFinished, RunNotFound, UsageError

log = logging.getLogger("orchestrator.agent")
MAX_RECORDED_CHARS = 2000
BUSY_WAIT_S = float(os.environ.get("ORCHESTRATOR_BUSY_WAIT_S", "10"))
"""How long an acting tool waits for a run another process holds before it is refused as busy."""
ACTING = frozenset({"advance", "answer", "submit", "revert_patches", "note", "escalate", "write_file",
                    "edit_file", "apply_diff", "commit_branch", "apply_fix"})
"""Tools that change a run or its target: each runs and is recorded under the run's lock."""
READ_RECORD_WAIT_S = 0.5
"""How long a read (status, explain, read_file...) waits to record itself: reads never wait on a busy run."""


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
    args: type[ToolArgs]
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
              progress: Callable[[str], None] = lambda _m: None, who: dict[str, Any] | None = None) -> ToolResult:
    """Validate, run and record one tool call; never raises for a refused or failed call.

    ``who``: the agent as its transport names it (``trail.identity``: an MCP client, our loop's model); every
    event the call writes as the agent carries it.

    An exception outside the error family (a bug) is recorded as the call's outcome where the
    call names a run, and then re-raised with its traceback.

    The call is recorded on the run named by ``run_id`` (for start_run: the new run); calls
    that name no existing run (list_runs, a bad id) have no trail to go to.
    """
    if who is not None:
        store = store.acting(agent=who)
    env = ToolEnv(store=store, call_id=call_id, progress=progress)
    run_id = arguments.get("run_id") if isinstance(arguments.get("run_id"), str) else None
    if name in ACTING and run_id:
        return _act_recorded(name, arguments, run_id=run_id, env=env)
    try:
        result = _dispatch(name, arguments, env=env)
    except Exception as exc:  # a bug: recorded where the call named a run, then re-raised with its traceback
        if run_id:
            record_action(store, run_id, tool=name, call_id=call_id, arguments=arguments, outcome=_bug(exc),
                          wait_s=READ_RECORD_WAIT_S)
        raise
    if name == "start_run":
        run_id = result.data.get("run_id")
    if run_id and not record_action(store, run_id, tool=name, call_id=call_id, arguments=arguments,
                                    outcome=result.outcome(), wait_s=READ_RECORD_WAIT_S):
        result = result.model_copy(update={"message": f"{result.message}; this call is not in the trail: run {run_id} "
                                   "is busy (another process is changing it), so the answer is its last committed "
                                   "state and no record could be written"})
    return result


def _act_recorded(name: str, arguments: dict[str, Any], *, run_id: str, env: ToolEnv) -> ToolResult:
    """Hold the run's lock across the action and its record: recorded, or refused as busy before acting."""
    from orchestrator.trail import events as ev

    try:
        with env.store.open_run(run_id, wait_s=BUSY_WAIT_S) as run:
            def acted(outcome: str) -> None:
                run.append(ev.AgentActed(tool=name, call_id=env.call_id, arguments=_recordable(arguments),
                                         outcome=outcome[:1000]), actor="agent", phase=run.state["phase"] or None)

            try:
                result = _dispatch(name, arguments, env=env)
            except Exception as exc:  # a bug: recorded under the same lock, then re-raised with its traceback
                acted(_bug(exc))
                raise
            acted(result.outcome())
            return result
    except (RunBusy, RunNotFound) as exc:
        why = "another process holds the run" if isinstance(exc, RunBusy) else "there is no such run"
        return said_not_done(name, ToolResult(status="refused", data={"code": exc.code}, message=(
            f"{exc.message}; nothing was done and this call is not in the trail ({why})")))
    except OrchestratorError as exc:  # a trail the engine will not act on
        return ToolResult(status="error", data={"code": exc.code}, message=(
            f"{exc.message}; nothing was done and this call is not in the trail (the engine writes to no trail "
            "it cannot verify)"))


def _bug(exc: Exception) -> str:
    """The AgentActed outcome of a call that an exception outside the error family stopped."""
    return f"error: the call stopped on an internal error ({type(exc).__name__}: {' '.join(str(exc).split())[:300]})"


def _dispatch(name: str, arguments: dict[str, Any], *, env: ToolEnv) -> ToolResult:
    return said_not_done(name, _handle(name, arguments, env=env))


def said_not_done(name: str, result: ToolResult) -> ToolResult:
    """A refused or failed write to the target leads with what did not happen ("edit NOT made: ...")."""
    lead = NOT_DONE.get(name)
    if lead and result.is_error and not result.message.startswith(lead):
        return result.model_copy(update={"message": f"{lead}: {result.message}"})
    return result


def _handle(name: str, arguments: dict[str, Any], *, env: ToolEnv) -> ToolResult:
    spec = TOOLS.get(name)
    if spec is None:
        return ToolResult(status="error", message=f"unknown tool {name!r}; tools: {', '.join(TOOLS)}")
    try:
        return spec.handler(spec.args.model_validate(arguments), env)
    except ValidationError as exc:
        return ToolResult(status="refused", message=f"bad arguments for {name}: " + _errors(exc))
    except UnicodeError:
        return ToolResult(status="refused", message=f"bad arguments for {name}: a value is not valid UTF-8 text")
    except OrchestratorError as exc:
        status: Status = "refused" if isinstance(exc, UsageError) and not isinstance(exc, RunBusy) else "error"
        return ToolResult(status=status, message=exc.message,
                          data={"code": exc.code, **getattr(exc, "details", {})})


def record_action(store: Any, run_id: str, *, tool: str, call_id: str, arguments: dict[str, Any],
                  outcome: str, wait_s: float = 10.0) -> bool:
    """Append AgentActed under the run's lock (waiting up to ``wait_s``); False when it stayed busy."""
    from orchestrator.trail import events as ev
    from orchestrator.errors import RunNotFound

    deadline = time.monotonic() + wait_s
    while True:
        try:
            with store.open_run(run_id) as run:
                run.append(ev.AgentActed(tool=tool, call_id=call_id, arguments=_recordable(arguments),
                                         outcome=outcome[:1000]), actor="agent", phase=run.state["phase"] or None)
            return True
        except RunNotFound:
            return True  # no run, no trail: the answer already says the run does not exist
        except RunBusy:
            if time.monotonic() > deadline:
                log.warning("could not record %s call %s on run %s: run busy", tool, call_id, run_id)
                return False
            time.sleep(0.1)


def _recordable(arguments: dict[str, Any]) -> dict[str, Any]:
    """Arguments as recorded: long strings (file contents, diffs) become their size and sha256."""
    out: dict[str, Any] = {}
    for key, value in arguments.items():
        if isinstance(value, str) and len(value) > MAX_RECORDED_CHARS:
            digest = hashlib.sha256(value.encode("utf-8")).hexdigest()
            value = {"chars": len(value), "sha256": digest, "head": value[:200]}
        out[key] = value
    text = json.dumps(out, default=str, ensure_ascii=False)
    return json.loads(text.encode("utf-8", "replace").decode("utf-8"))  # lone surrogates become "?"


def _errors(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in exc.errors())


# --- handlers ----------------------------------------------------------------------------


def start_run(args: StartRunArgs, env: ToolEnv) -> ToolResult:
    from orchestrator import engine

    outcome = engine.start(args.workflow, args.options, store=env.store, actor="agent")
    if outcome.state["awaiting"] == "human":  # questions known at start (e.g. add-moe-model's branch and commit)
        return state_result(outcome.state, lead=f"started run {outcome.run_id}; before its first advance it waits for "
                                                "a person's answers to the questions explain lists")
    return state_result(outcome.state, lead=f"started run {outcome.run_id}; call explain, then advance")


def status(args: StatusArgs, env: ToolEnv) -> ToolResult:
    return state_result(env.store.read_state(args.run_id))


def advance(args: AdvanceArgs, env: ToolEnv) -> ToolResult:
    from orchestrator import engine

    state = live_state(env.store, args.run_id)
    if state["awaiting"] == "human" and state["pending"]:
        return state_result(state, lead="not advanced")
    outcome = engine.advance(args.run_id, store=env.store, progress=env.progress, max_phases=1)
    return state_result(outcome.state, exit_code=outcome.exit_code, messages=outcome.messages)


def list_runs(args: ListRunsArgs, env: ToolEnv) -> ToolResult:
    from orchestrator.workflow import workflow_refs

    keys = ("run_id", "workflow", "phase", "status", "awaiting", "summary")
    rows = [{k: s.get(k) for k in keys} for s in map(env.store.read_state, env.store.list_run_ids())]
    return ToolResult(status="ok", message=f"{len(rows)} run(s)",
                      data={"runs": rows, "workflows": sorted(workflow_refs())})


def read_artifact(args: ReadArtifactArgs, env: ToolEnv) -> ToolResult:
    from orchestrator.trail.writer import ARTIFACTS, check_artifact_name

    state = env.store.read_state(args.run_id)
    name = check_artifact_name(args.name)
    if name not in state["artifacts"]:
        known = ", ".join(sorted(state["artifacts"])[:60]) or "none"
        return ToolResult(status="refused", message=f"run {args.run_id} recorded no artifact {name!r}; known: {known}")
    text = (env.store.run_dir(args.run_id) / ARTIFACTS / name).read_text(encoding="utf-8", errors="replace")
    chunk = text[args.offset:args.offset + args.max_chars]
    following = args.offset + len(chunk)
    return ToolResult(status="ok", message=f"artifact {name}: {len(chunk)} of {len(text)} chars",
                      data={"name": name, "total_chars": len(text), "offset": args.offset,
                            "next_offset": following if following < len(text) else None}, text=chunk)


def explain(args: ExplainArgs, env: ToolEnv) -> ToolResult:
    from orchestrator.engine import blocking_reasons
    from orchestrator.fix_index import issues_with_offers, offer_views
    from orchestrator.workflow import load_workflow

    state = env.store.read_state(args.run_id)
    spec = phase_spec(state)
    workflow = load_workflow(state["workflow"])
    blocking = blocking_reasons(workflow, state) if spec else []
    pending = [{**{k: q.get(k) for k in ("key", "prompt", "choices")},
                "who": "a human only (the answer tool refuses it)" if q["human_only"] else "you may answer"}
               for q in state["pending"]]
    busy = env.store.busy(args.run_id)
    why = why_waiting(state, busy=busy)
    data = {
        "run_id": state["run_id"], "workflow": state["workflow"], "target": state["target"],
        "phase": state["phase"], "title": spec.title if spec else "", "status": state["status"],
        "awaiting": state["awaiting"], "summary": state["summary"], "why": why,
        "issues": state["issues"], "pending": pending, "violations": state["violations"],
        "allowed_paths": list(spec.allowed_paths) if spec else [],
        "agent_notes": spec.agent_notes if spec else "",
        "phase_findings": shrink(state["results"].get(state["phase"], {})),
        "outcome": outcome_so_far(state),
        "blocking_next_phase": blocking, "open_patches": state["open_patches"],
        "artifacts": sorted(state["artifacts"]),
        "submissions": submission_schemas(workflow, state["phase"]),
    }
    data["fix_offers"] = offer_views(env.store.runs_dir, state, env.store.read_events(args.run_id))
    data["issues"] = issues_with_offers(state, data["fix_offers"])
    rows = {kind: row for kind, row in workflow.submissions.items() if row.phase == state["phase"]}
    data["next_steps"] = next_steps(state, spec, submissions=rows, offers=data["fix_offers"])
    if busy and state["status"] not in ("done", "aborted"):
        data["next_steps"] = [BUSY_STEP]
    return ToolResult(status="ok", message=why, data=data)


def answer(args: AnswerArgs, env: ToolEnv) -> ToolResult:
    from orchestrator import engine

    state = live_state(env.store, args.run_id)
    question = next((q for q in state["pending"] if q["key"] == args.key), None)
    if question is None:
        pending = ", ".join(q["key"] for q in state["pending"]) or "none"
        return ToolResult(status="refused", message=f"no pending question {args.key!r} (pending: {pending})")
    if question["human_only"]:
        return ToolResult(status="refused", data={"waiting_for_human": True},
                          message=f"waiting for a human: question {args.key!r} is for a person only; the run stays "
                                  f"paused until one runs `orchestrator resume {args.run_id} --answer {args.key}=...`")
    outcome = engine.resume(args.run_id, {args.key: args.value}, store=env.store, actor="agent",
                            tool_call_id=env.call_id, advance_after=False)
    lead = f"answer {args.key}={args.value} recorded; call advance"
    if not outcome.state["pending"]:
        lead += (f": phase {outcome.state['phase']} has not run with it yet, so the summary and issues below "
                 "are from before the answer")
    return state_result(outcome.state, lead=lead)


def submit(args: SubmitArgs, env: ToolEnv) -> ToolResult:
    from orchestrator import engine

    outcome = engine.submit(args.run_id, args.kind, args.args, store=env.store, actor="agent",
                            tool_call_id=env.call_id, progress=env.progress)
    return state_result(outcome.state, exit_code=outcome.exit_code, messages=outcome.messages)


def revert_patches(args: RevertPatchesArgs, env: ToolEnv) -> ToolResult:
    from orchestrator.ledger import revert_patches as revert

    outcome = revert(args.run_id, store=env.store, actor="agent", tool_call_id=env.call_id)
    return state_result(outcome.state, exit_code=outcome.exit_code, messages=outcome.messages)


def note(args: NoteArgs, env: ToolEnv) -> ToolResult:
    from orchestrator.trail import events as ev

    with env.store.open_run(args.run_id) as run:
        event = run.append(ev.NoteAdded(kind=args.kind, text=args.text), actor="agent", phase=run.state["phase"])
    return ToolResult(status="ok", message=f"{args.kind} note recorded (seq {event['seq']})")


def escalate(args: EscalateArgs, env: ToolEnv) -> ToolResult:
    from orchestrator.trail import events as ev
    from orchestrator.workflow import load_workflow

    with env.store.open_run(args.run_id) as run:
        if run.state["status"] in ("done", "aborted"):
            raise RunIsFinished(f"run {args.run_id} is {run.state['status']}; nothing to escalate")
        key = args.key or f"agent_question_{run.state['last_seq'] + 1}"
        if any(q["key"] == key for q in run.state["pending"]):
            raise UsageError(f"a question {key!r} is already pending; pick another key")
        if key in run.state["answers"] or key in load_workflow(run.state["workflow"]).human_options:
            raise UsageError(f"{key!r} is a question of the workflow itself (only a person answers it, when the "
                             "workflow asks); pick another key for your own question")
        run.append(ev.QuestionAsked(key=key, prompt=args.question, choices=args.choices or None, human_only=True),
                   actor="agent", phase=run.state["phase"])
        options = what_a_person_can_do(run.state)
        lead = (f"question {key!r} posted for a human. The engine cannot act on it: a person's answer comes back "
                f"to you (agent_answers) and re-runs nothing. What a person can do: {'; '.join(options)}")
        result = state_result(run.state, lead=lead)
        return result.model_copy(update={"data": {**result.data, "engine_acts_on_answer": False,
                                                   "a_person_can": options}})


_SPECS = [
    ("start_run", StartRunArgs, start_run), ("status", StatusArgs, status), ("advance", AdvanceArgs, advance),
    ("list_runs", ListRunsArgs, list_runs), ("read_artifact", ReadArtifactArgs, read_artifact),
    ("explain", ExplainArgs, explain), ("answer", AnswerArgs, answer), ("submit", SubmitArgs, submit),
    ("revert_patches", RevertPatchesArgs, revert_patches), ("note", NoteArgs, note),
    ("escalate", EscalateArgs, escalate), ("read_file", ReadFileArgs, read_file),
    ("write_file", WriteFileArgs, write_file), ("edit_file", EditFileArgs, edit_file),
    ("apply_diff", ApplyDiffArgs, apply_diff), ("commit_branch", CommitBranchArgs, commit_branch),
    ("apply_fix", ApplyFixArgs, apply_fix),
]
TOOLS: dict[str, ToolSpec] = {name: ToolSpec(name=name, args=model, handler=fn) for name, model, fn in _SPECS}

__all__ = ["TOOLS", "ToolEnv", "ToolResult", "ToolSpec", "call_tool", "record_action", "state_result"]
