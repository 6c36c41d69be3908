"""Thin command line: parse, call the engine, render with rich text or ``--json``.

Heavy modules (the engine, pydantic models, GitPython, phases) are imported inside the
commands so that ``status`` and ``audit`` start fast; torch is never imported here.
Exit codes: 0 done/progressed, 1 failed or rule broken, 2 bad usage, 3 human, 4 agent.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Any, Callable

import click

from orchestrator.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, OrchestratorError, UsageError

DEFAULT_STATE_DIR = "state"


class _Settings:
    def __init__(self, *, as_json: bool, state_dir: str | None, debug: bool) -> None:
        self.as_json = as_json
        self.state_dir = Path(state_dir or os.environ.get("ORCHESTRATOR_STATE_DIR") or DEFAULT_STATE_DIR)
        self.debug = debug or os.environ.get("ORCHESTRATOR_DEBUG") == "1"

    def store(self) -> Any:
        from orchestrator.store import RunStore

        return RunStore(self.state_dir)

    def progress(self) -> Callable[[str], None]:
        if self.as_json:
            return lambda _message: None
        if sys.stderr.isatty():
            from rich.console import Console

            console = Console(stderr=True)
            return lambda message: console.print(f"[dim]… {message}[/dim]", highlight=False)
        return lambda message: print(f"... {message}", file=sys.stderr, flush=True)


def command(group: click.Group, name: str, **kwargs: Any) -> Callable:
    """Register a command with the options every command takes, and one error handler."""

    def decorate(func: Callable) -> Callable:
        @group.command(name, **kwargs)
        @click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
        @click.option("--state-dir", metavar="DIR", help="Runs live in DIR/runs (env ORCHESTRATOR_STATE_DIR).")
        @click.option("--debug", is_flag=True, help="Show tracebacks.")
        @functools.wraps(func)
        def wrapper(as_json: bool, state_dir: str | None, debug: bool, **params: Any) -> None:
            settings = _Settings(as_json=as_json, state_dir=state_dir, debug=debug)
            try:
                code = func(settings, **params)
            except OrchestratorError as exc:
                if settings.debug:
                    import traceback

                    traceback.print_exc()
                from orchestrator.render import emit_error

                emit_error(exc.code, exc.message, as_json=settings.as_json)
                sys.exit(exc.exit_code)
            except KeyboardInterrupt:
                print("interrupted; the trail keeps everything recorded so far "
                      "(`orchestrator advance` picks up the interrupted phase)", file=sys.stderr)
                sys.exit(130)
            sys.exit(code or EXIT_OK)

        return wrapper

    return decorate


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """orchestrator: torchtitan agent skills as persisted, auditable state machines."""


def _print_outcome(settings: _Settings, outcome: Any) -> int:
    from orchestrator.render import emit_json, status_text, status_view

    if settings.as_json:
        emit_json(status_view(outcome.state))
    else:
        for message in outcome.messages:
            print(message, file=sys.stderr)
        print(status_text(outcome.state))
    return outcome.exit_code


def parse_extra_options(args: list[str]) -> dict[str, Any]:
    """``--model X --commit never --dry`` -> {"model": "X", "commit": "never", "dry": True}."""
    options: dict[str, Any] = {}
    index = 0
    while index < len(args):
        arg = args[index]
        if not arg.startswith("--") or arg == "--":
            raise UsageError(f"unexpected argument {arg!r}; workflow options look like --name VALUE")
        key, _, inline = arg[2:].partition("=")
        key = key.replace("-", "_")
        if inline:
            options[key] = inline
        elif index + 1 < len(args) and not args[index + 1].startswith("--"):
            options[key] = args[index + 1]
            index += 1
        else:
            options[key] = True
        index += 1
    return options


_EXTRA = {"ignore_unknown_options": True, "allow_extra_args": True}


@command(main, "start", context_settings=_EXTRA)
@click.argument("workflow")
def start_cmd(settings: _Settings, workflow: str) -> int:
    """Start a run of WORKFLOW; workflow options follow (see `orchestrator graph WORKFLOW`)."""
    from orchestrator import engine

    extra = parse_extra_options(click.get_current_context().args)
    outcome = engine.start(workflow, extra, store=settings.store())
    if settings.as_json:
        from orchestrator.render import emit_json

        emit_json({"run_id": outcome.run_id})
    else:
        print(outcome.run_id)
    return outcome.exit_code


@command(main, "run", context_settings=_EXTRA)
@click.argument("workflow")
def run_cmd(settings: _Settings, workflow: str) -> int:
    """Start a run of WORKFLOW and advance it until it is done or waits."""
    from orchestrator import engine

    extra = parse_extra_options(click.get_current_context().args)
    started = engine.start(workflow, extra, store=settings.store())
    if not settings.as_json:
        print(f"run {started.run_id}", file=sys.stderr)
    outcome = engine.advance(started.run_id, store=settings.store(), progress=settings.progress())
    return _print_outcome(settings, outcome)


@command(main, "advance")
@click.argument("run_id")
@click.option("--max-phases", type=click.IntRange(min=1), default=None, help="Stop after N phase attempts.")
def advance_cmd(settings: _Settings, run_id: str, max_phases: int | None) -> int:
    """Run phases until RUN is done or waits on an agent or a human."""
    from orchestrator import engine

    outcome = engine.advance(run_id, store=settings.store(), progress=settings.progress(), max_phases=max_phases)
    return _print_outcome(settings, outcome)


@command(main, "resume")
@click.argument("run_id")
@click.option("--answer", "answers", multiple=True, metavar="KEY=VALUE", help="Answer a pending question.")
def resume_cmd(settings: _Settings, run_id: str, answers: tuple[str, ...]) -> int:
    """Answer pending questions of RUN (validated first), then advance."""
    from orchestrator import engine

    parsed = {}
    for item in answers:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--answer {item!r} must look like KEY=VALUE")
        parsed[key.strip()] = value
    outcome = engine.resume(run_id, parsed, store=settings.store(), progress=settings.progress())
    return _print_outcome(settings, outcome)


@command(main, "status")
@click.argument("run_id", required=False)
def status_cmd(settings: _Settings, run_id: str | None) -> int:
    """Show one run, or all runs."""
    from orchestrator.render import emit_json, status_text, status_view
    from orchestrator.snapshot import exit_code_for

    if run_id is None:
        return _print_runs(settings)
    state = settings.store().read_state(run_id)
    if settings.as_json:
        emit_json(status_view(state))
    else:
        print(status_text(state))
    return exit_code_for(state)


@command(main, "list")
def list_cmd(settings: _Settings) -> int:
    """List all runs (one line each)."""
    return _print_runs(settings)


def _print_runs(settings: _Settings) -> int:
    from orchestrator.render import emit_json, runs_table, status_view

    store = settings.store()
    states = [store.read_state(r) for r in store.list_run_ids()]
    if settings.as_json:
        emit_json({"runs": [status_view(s) for s in states]})
    else:
        print(runs_table(states))
    return EXIT_OK


@command(main, "show")
@click.argument("run_id")
@click.option("--events", "last_events", default=20, show_default=True, help="How many recent events.")
def show_cmd(settings: _Settings, run_id: str, last_events: int) -> int:
    """Show RUN's whole snapshot and its most recent events."""
    import json

    from orchestrator.render import emit_json

    store = settings.store()
    state, events = store.read_state(run_id), store.read_events(run_id)
    recent = events[-last_events:] if last_events > 0 else []
    if settings.as_json:
        emit_json({"run": state, "events": recent})
        return EXIT_OK
    print(json.dumps(state, indent=2, sort_keys=True))
    for event in recent:
        print(f"{event['seq']:>6} {event['ts'][:19]} {event['actor']:6} {event['phase'] or '-':18} {event['type']}")
    return EXIT_OK


@command(main, "audit")
@click.argument("run_id")
@click.option("--schema/--no-schema", default=False, show_default=True,
              help="Also validate every event against its pydantic model (slow on long trails).")
def audit_cmd(settings: _Settings, run_id: str, schema: bool) -> int:
    """Verify RUN's trail: hash chain, run.json, artifacts, workflow rules (and schema)."""
    from orchestrator.audit import audit_run
    from orchestrator.render import emit_json
    from orchestrator.workflow import load_workflow

    store = settings.store()
    run_dir = store.run_dir(run_id)
    rules = _rules_for(store, run_id, load_workflow)
    findings = audit_run(run_dir, rules=rules, schema=schema)
    if settings.as_json:
        emit_json({"run_id": run_id, "ok": not findings,
                   "findings": [{"seq": f.seq, "check": f.check, "message": f.message} for f in findings]})
    elif findings:
        for f in findings:
            print(f"seq {f.seq if f.seq is not None else '-':>6}  {f.check:18} {f.message}")
    else:
        checked = "chain, schema, run.json, artifacts, rules" if schema else "chain, run.json, artifacts, rules"
        print(f"{run_id}: trail intact ({checked})")
    return EXIT_FAILED if findings else EXIT_OK


def _rules_for(store: Any, run_id: str, load_workflow: Callable) -> dict[str, Any]:
    """The workflow's audit rules, if the trail's first line names a known workflow."""
    try:
        workflow = store.read_first_event(run_id)["data"]["workflow"]
        return dict(load_workflow(workflow).rules)
    except (OrchestratorError, KeyError, IndexError):
        return {}


@command(main, "abort")
@click.argument("run_id")
@click.option("--reason", required=True, help="Why the run stops (recorded).")
def abort_cmd(settings: _Settings, run_id: str, reason: str) -> int:
    """Stop RUN for good, recording why."""
    from orchestrator import engine

    return _print_outcome(settings, engine.abort(run_id, reason, store=settings.store()))


@command(main, "graph")
@click.argument("workflow")
def graph_cmd(settings: _Settings, workflow: str) -> int:
    """Print WORKFLOW's phase graph as a mermaid flowchart."""
    from orchestrator.render import emit_json
    from orchestrator.workflow import load_workflow

    wf = load_workflow(workflow)
    if settings.as_json:
        emit_json({"workflow": wf.name, "mermaid": wf.mermaid(),
                   "phases": [{"name": p.name, "title": p.title, "gates": list(p.gates),
                               "routes": wf.edges(p)} for p in wf.phases]})
    else:
        print(wf.mermaid(), end="")
    return EXIT_OK


def _register_plugins() -> None:
    """Commands that live in their own modules (patch ledger, candidates, agent, mcp, survey)."""
    import importlib

    for module in ("orchestrator.cli_extra", "orchestrator.cli_agent", "phases.local_compile_perf.cli",
                   "phases.add_moe_model.survey.cli"):
        try:
            importlib.import_module(module).register(main, command)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise


_register_plugins()

if __name__ == "__main__":
    sys.exit(main())

__all__ = ["EXIT_USAGE", "main"]
