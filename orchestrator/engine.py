"""start / advance / resume / abort: the engine drives a transitions.Machine per run.

The trail is the truth. The machine is rebuilt for every call from the workflow table,
positioned at the state name recorded in the snapshot (never pickled). Gates are the
machine's named conditions, so ``may_<trigger>()`` answers "could this advance?" without
side effects. One call holds the run's lock from start to end; a crash mid-phase leaves
a ``phase_started`` without its ``phase_completed``, which the next call detects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError

from orchestrator.trail import events as ev
from orchestrator.context import json_safe, phase_context
from orchestrator.answers import validate_answer
from orchestrator.edits import record_edits, record_outside
from orchestrator.errors import EXIT_OK, OrchestratorError, RunIsFinished, UsageError, WorkerFailed
from orchestrator.fix_index import after_completion
from orchestrator.trail.snapshot import TERMINAL, exit_code_for
from orchestrator.trail.store import RunStore, new_run_id
from orchestrator.trail.writer import OpenRun
from orchestrator.handback import read_results, record_handback
from orchestrator.on_entry import ask_known_questions, clear_dead_git_locks
from orchestrator.resume_report import AGENT_QUESTION_ONLY, NOT_ADVANCED, wait_point, with_report
from orchestrator.waivers import apply_waivers, unapplied_waivers, validate_waiver, waived_codes
from orchestrator.worker import FRESH, Runner
from orchestrator.workflow import DONE, Workflow, load_workflow

Progress = Callable[[Any], None]
"""Takes each progress line of a phase: an ``orchestrator.progress.Update`` (``str()`` is the line to print)."""


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What a command did: the run's state afterwards and the exit code it maps to."""

    run_id: str
    state: dict[str, Any]
    exit_code: int
    messages: tuple[str, ...] = field(default_factory=tuple)
    details: dict[str, Any] = field(default_factory=dict)
    """Fields a command adds to its ``--json`` object (resume: ``recorded``, ``still_waiting``, ``moved``)."""


def start(workflow_name: str, raw_options: dict[str, Any], *, store: RunStore, actor: str = "human",
          runner: Runner = FRESH) -> Outcome:
    """Validate options, prepare the target, create the run. Bad input writes nothing.

    ``runner``: which process runs the worker calls of ``prepare`` (a survey passes its warm server's).

    Options the workflow marks human-only (they answer a human-only question) are taken only
    from a person (``actor="human"``, the CLI); an agent's start with one is refused.
    """
    workflow = load_workflow(workflow_name)
    _refuse_human_options(workflow, raw_options, actor=actor)
    try:
        options = workflow.options.model_validate(raw_options)
    except ValidationError as exc:
        raise UsageError(f"{workflow_name}: " + _validation_message(exc)) from None
    store.check_writable()
    made_state_dir = not store.state_dir.exists()
    try:
        return _start_prepared(workflow, options, store=store, actor=actor, runner=runner)
    except BaseException:
        if made_state_dir:
            _remove_if_runless(store)
        raise


def _start_prepared(workflow: Workflow, options: Any, *, store: RunStore, actor: str, runner: Runner) -> Outcome:
    prepared = workflow.prepare(options, str(store.state_dir), runner=runner)
    if prepared.answers and actor != "human":
        raise UsageError(f"start options {', '.join(sorted(prepared.answers))} answer questions only a person may "
                         "answer; a person starts this run with `orchestrator start`")
    from orchestrator.git import capture_base
    from orchestrator.inputs import keep_copies, record_inputs

    base = capture_base(prepared.target)
    inputs, copies = record_inputs(prepared.options, record_path=store.record_path)
    run_id = new_run_id(workflow.name)
    store.create_run(run_id, ev.RunStarted(
        workflow=workflow.name, target=store.record_path(prepared.target), options=json_safe(prepared.options),
        inputs=[ev.InputFile(**entry) for entry in inputs], base=base, initial_phase=workflow.initial), actor=actor)
    with store.open_run(run_id) as run:
        keep_copies(run, copies)
        if prepared.answers:
            run.append_many([ev.AnswerAccepted(key=key, value=value) for key, value in prepared.answers.items()],
                            actor="human")
        ask_known_questions(run, workflow)
    return Outcome(run_id=run_id, state=store.read_state(run_id), exit_code=EXIT_OK)


def _refuse_human_options(workflow: Workflow, raw_options: dict[str, Any], *, actor: str) -> None:
    given = sorted(k for k in workflow.human_options if raw_options.get(k) not in (None, ""))
    if given and actor != "human":
        raise UsageError(f"{workflow.name}: option(s) {', '.join(given)} answer questions only a person may "
                         "answer; leave them out (the run asks a person) or let a person start the run")


def _remove_if_runless(store: RunStore) -> None:
    """Undo a state dir this refused start created (unless another process started a run in it meanwhile)."""
    import shutil

    runs = store.runs_dir
    if runs.is_dir() and any(p for p in runs.iterdir() if not p.name.startswith(".")):
        return
    shutil.rmtree(store.state_dir, ignore_errors=True)


def advance(run_id: str, *, store: RunStore, progress: Progress = lambda _: None,
            max_phases: int | None = None, runner: Runner = FRESH) -> Outcome:
    """Run phases until the run is done or waits on an agent or a human.

    ``runner``: which process runs the phases' worker calls (a survey passes its warm server's).
    """
    with store.open_run(run_id) as run:
        refuse_terminal(run.state)
        workflow = load_workflow(run.state["workflow"])
        return drive_open_run(run, workflow, progress=progress, max_phases=max_phases, runner=runner)


def resume(run_id: str, answers: dict[str, str], *, store: RunStore, actor: str = "human",
           tool_call_id: str | None = None, progress: Progress = lambda _: None,
           advance_after: bool = True, results: Path | None = None,
           waivers: dict[str, str] | None = None) -> Outcome:
    """Validate every answer first (nothing written if one is bad), record them, advance.

    ``results``: a directory of the current phase's work run elsewhere, read by the phase's
    ``results`` hook; what it yields is recorded as the human's before the answers.
    ``waivers``: finding code -> reason, a person's waivers of the current phase's findings.
    """
    with store.open_run(run_id) as run:
        refuse_terminal(run.state)
        handback = read_results(run.state, results) if results is not None else None
        answers = {**(handback.answers if handback else {}), **answers}
        parsed = {key: validate_answer(run.state, key, value, actor=actor) for key, value in answers.items()}
        parsed.update({validate_waiver(run.state, code, reason, actor=actor): reason
                       for code, reason in (waivers or {}).items()})
        if handback is not None:
            record_handback(run, handback, workflow=load_workflow(run.state["workflow"]))
        agent_keys, before = set(run.state["agent_asked"]), wait_point(run.state)
        run.append_many([ev.AnswerAccepted(key=key, value=value, tool_call_id=tool_call_id)
                         for key, value in parsed.items()], actor=actor, phase=run.state["phase"])
        run.flush()
        # NOTE: an answer to the agent's own question changes nothing a phase reads, so it re-runs
        # nothing, unless a waiver recorded earlier still waits for the phase to run again.
        only_agent_questions = bool(parsed) and set(parsed) <= agent_keys and not unapplied_waivers(run.state)
        if not advance_after or only_agent_questions:
            messages = ((AGENT_QUESTION_ONLY if only_agent_questions else NOT_ADVANCED)
                        .format(run_id=run_id, phase=run.state["phase"]),)
            outcome = Outcome(run_id=run_id, state=run.state, exit_code=exit_code_for(run.state), messages=messages)
        else:
            outcome = drive_open_run(run, load_workflow(run.state["workflow"]), progress=progress, max_phases=None)
        return with_report(outcome, parsed, agent_keys=agent_keys, before=before)


def abort(run_id: str, reason: str, *, store: RunStore, actor: str = "human") -> Outcome:
    if not reason.strip():
        raise UsageError("abort needs --reason TEXT: the trail must say why the run stopped")
    from orchestrator.jobs import cancel_open

    with store.open_run(run_id) as run:
        refuse_terminal(run.state)
        record_outside(run)
        cancelled = cancel_open(run.state)
        if cancelled:
            run.append(ev.NoteAdded(kind="engine", text=f"scancel of the run's job(s) {', '.join(cancelled)}"))
        from orchestrator.git import uncommitted_left

        left = uncommitted_left(run.state["target"], run.state.get("base") or {})
        if left:
            run.append(ev.NoteAdded(kind="engine", text=left))
        run.append(ev.RunAborted(reason=reason), actor=actor)
        return Outcome(run_id=run_id, state=run.state, exit_code=EXIT_OK, messages=(left,) if left else ())


def submit(run_id: str, kind: str, args: dict[str, Any], *, store: RunStore, actor: str = "human",
           tool_call_id: str | None = None, progress: Progress = lambda _: None) -> Outcome:
    """Take a submission (a row of the workflow's ``submissions``), all under the run's lock.

    The row's model validates ``args`` and its check refuses or acts and records; then the run
    is driven on (when the row says so) before the lock is released, so no other command slips
    in between. Bad input (unknown kind, wrong phase, arguments the model refuses, the check's
    refusal) raises UsageError and records nothing the check did not record itself.
    """
    from orchestrator.workflow import resolve_ref

    with store.open_run(run_id) as run:
        refuse_terminal(run.state)
        workflow = load_workflow(run.state["workflow"])
        ctx, row = submission_context(run, workflow, kind, actor=actor, progress=progress)
        try:
            parsed = row.args.model_validate(args)
        except ValidationError as exc:
            raise UsageError(f"{kind}: " + _validation_message(exc)) from None
        resolve_ref(row.check)(ctx, parsed, tool_call_id)
        run.flush()
        if row.drive:
            return drive_open_run(run, workflow, progress=progress, max_phases=None)
        return Outcome(run_id=run_id, state=run.state, exit_code=exit_code_for(run.state))


def submission_context(run: OpenRun, workflow: Workflow, kind: str, *, actor: str,
                       progress: Progress = lambda _: None) -> tuple[Any, Any]:
    """The context and row of a ``kind`` submission (or of undoing one: ``ledger.revert_patches``).

    Raises:
        UsageError: the table has no ``kind`` row, or the run is not in the row's phase.
    """
    from orchestrator.workflow import PATCH

    row = workflow.submissions.get(kind)
    if row is None:
        taken = "temporary patches" if kind == PATCH else f"{kind!r} submissions"
        kinds = ", ".join(sorted(workflow.submissions)) or "none"
        raise UsageError(f"workflow {workflow.name} takes no {taken} (it takes: {kinds})")
    if run.state["phase"] != row.phase:
        raise UsageError(f"{row.noun or kind} are accepted only in phase {row.phase}; run {run.run_id} is in "
                         f"{run.state['phase']}")
    clear_dead_git_locks(run)
    return phase_context(run, workflow, phase=row.phase, progress=progress, actor=actor), row


def refuse_terminal(state: dict[str, Any]) -> None:
    """RunIsFinished (exit 2) for a run that is done or aborted."""
    if state["status"] in TERMINAL:
        raise RunIsFinished(f"run {state['run_id']} is {state['status']}; start a new run instead")


def drive_open_run(run: OpenRun, workflow: Workflow, *, progress: Progress, max_phases: int | None,
                   runner: Runner = FRESH) -> Outcome:
    """Run phases of a run whose lock the caller holds (``advance``, ``resume``, ``submit``)."""
    clear_dead_git_locks(run)
    messages: list[str] = []
    done = 0
    record_edits(run, workflow, by="outside")
    while True:
        state = run.state
        if state["phase"] == DONE or state["status"] in TERMINAL:
            break
        if state["pending"] and state["awaiting"] == "human":
            messages.append("waiting for a human: " + ", ".join(q["key"] for q in state["pending"]))
            break
        if state["awaiting"] == "job":
            from orchestrator.jobs import collect

            still = collect(run, workflow)
            if still:
                messages.append(still)
                break
        if not _guards_hold(run, workflow):
            break
        if max_phases is not None and done >= max_phases:
            break
        name, attempt, result = _run_phase(run, workflow, progress=progress, runner=runner)
        record_edits(run, workflow, by="phase")
        result = workflow.check_result(name, apply_waivers(result, waived_codes(run.state, name)))
        done += 1
        with run.atomic():  # completion, questions and transition land in one write, or none does
            _complete(run, name, attempt, result)
            moved = result.outcome == "passed" and _take_route(run, workflow, result.route)
            if moved and run.state["phase"] == DONE:
                run.append(ev.RunFinished(summary=run.state["summary"] or "all phases passed"))
        after_completion(run, phase=name)
        run.flush()
        if not moved:
            break
    if run.state["phase"] == DONE and run.state["status"] != "done":
        run.append(ev.RunFinished(summary=run.state["summary"] or "all phases passed"))
    return Outcome(run_id=run.run_id, state=run.state, exit_code=exit_code_for(run.state),
                   messages=tuple(messages))


def _guards_hold(run: OpenRun, workflow: Workflow) -> bool:
    ok = True
    for name, guard in workflow.guards.items():
        violation = guard(run.state)
        open_before = any(v["guard"] == name for v in run.state["violations"])
        if violation is not None:
            run.append(ev.GuardViolated(guard=name, message=violation.message, paths=list(violation.paths)),
                       phase=run.state["phase"])
            ok = False
        elif open_before:
            run.append(ev.GuardCleared(guard=name), phase=run.state["phase"])
    return ok


def _run_phase(run: OpenRun, workflow: Workflow, *, progress: Progress, runner: Runner) -> tuple[str, int, Any]:
    from orchestrator.phase_api import PhaseResult

    name = run.state["phase"]
    module = workflow.modules[name]
    interrupted = run.state["in_flight"] == name
    if interrupted:
        action = "reconcile" if callable(getattr(module, "reconcile", None)) else "rerun"
        run.append(ev.PhaseInterrupted(attempt=run.state["attempts"].get(name, 0), action=action), phase=name)
    attempt = run.state["attempts"].get(name, 0) + 1
    run.append(ev.PhaseStarted(attempt=attempt), phase=name)
    run.flush()
    ctx = phase_context(run, workflow, phase=name, progress=progress, runner=runner)
    ctx.interrupted = interrupted
    entry = module.reconcile if interrupted and hasattr(module, "reconcile") else module.run
    try:
        try:
            result = entry(ctx)
        finally:
            for hook in workflow.after_phase:
                hook(ctx)
    except KeyboardInterrupt as exc:  # SIGINT, or SIGTERM (the CLI turns it into CommandStopped)
        stopped = run.append(ev.CommandInterrupted(signal=getattr(exc, "signal_name", "SIGINT"), command_phase=name),
                             phase=name)
        exc.recorded_seq = stopped["seq"]  # the CLI says the trail records the stop only when it does
        raise
    except WorkerFailed as exc:
        result = PhaseResult(outcome="failed", summary=f"{name}: {exc.message.splitlines()[0]}",
                             data={"error": exc.message, "log": exc.log})
    except OrchestratorError as exc:
        result = PhaseResult(outcome="failed", summary=f"{name}: {exc.message}",
                             data={"error": exc.message, "code": exc.code})
    return name, attempt, result


def _complete(run: OpenRun, name: str, attempt: int, result: Any) -> None:
    issues = [ev.IssueData(code=i.code, message=i.message, fix_location=i.fix_location) for i in result.issues]
    run.append(ev.PhaseCompleted(attempt=attempt, outcome=result.outcome, summary=result.summary,
                                 data=json_safe(result.data), issues=issues, route=result.route), phase=name)
    for q in result.questions:
        run.append(ev.QuestionAsked(key=q.key, prompt=q.prompt, choices=list(q.choices) if q.choices else None,
                                    answer_schema=q.schema, human_only=q.human_only), phase=name)


def build_machine(workflow: Workflow, state: dict[str, Any]) -> Any:
    """A transitions.Machine for this run, positioned at the recorded state.

    Triggers are ``route_<label>``; each transition's conditions are the destination's
    gates, evaluated on the snapshot. ``model.may_route_next()`` is the dry check.
    """
    from transitions import Machine

    model = _GateModel(workflow, state)
    transitions = [
        {"trigger": f"route_{label}", "source": spec.name, "dest": dest,
         "conditions": [f"gate_open__{g}" for g in _gates_of(workflow, dest)]}
        for spec in workflow.phases for label, dest in workflow.edges(spec).items()
    ]
    Machine(model=model, states=[p.name for p in workflow.phases] + [DONE], transitions=transitions,
            initial=state["phase"], auto_transitions=False)
    return model


def _gates_of(workflow: Workflow, dest: str) -> tuple[str, ...]:
    return () if dest == DONE else workflow.phase(dest).gates


class _GateModel:
    """The machine's model: one ``gate_open__<name>`` condition per gate of the workflow."""

    def __init__(self, workflow: Workflow, state: dict[str, Any]) -> None:
        self.snapshot = state
        for name, gate in workflow.gates.items():
            setattr(self, f"gate_open__{name}", lambda gate=gate: not gate(self.snapshot))


def blocking_reasons(workflow: Workflow, state: dict[str, Any], route: str = "next") -> list[str]:
    """Why the current phase's ``route`` edge could not be taken now (pure; writes nothing)."""
    dest = workflow.edges(workflow.phase(state["phase"])).get(route)
    if dest is None:
        return [f"phase {state['phase']} has no route {route!r}"]
    return [r for g in _gates_of(workflow, dest) for r in workflow.gates[g](state)]


def _take_route(run: OpenRun, workflow: Workflow, route: str) -> bool:
    source = run.state["phase"]
    edges = workflow.edges(workflow.phase(source))
    if route not in edges:
        run.append(ev.GateBlocked(dest="?", reasons=[f"phase {source} returned undeclared route {route!r}"]),
                   phase=source)
        return False
    model = build_machine(workflow, run.state)
    if not getattr(model, f"may_route_{route}")():
        run.append(ev.GateBlocked(dest=edges[route], reasons=blocking_reasons(workflow, run.state, route)),
                   phase=source)
        return False
    getattr(model, f"route_{route}")()
    run.append(ev.TransitionTaken(source=source, dest=model.state, trigger=f"route_{route}"), phase=source)
    ask_known_questions(run, workflow)
    return True


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "options"
        parts.append(f"--{where.replace('_', '-')}: {err['msg']}")
    return "; ".join(parts)
