"""Thin command line: parse, call the engine, render with rich text or ``--json``.

Heavy modules (the engine, pydantic models, GitPython, phases) are imported inside the
commands so that ``status`` and ``audit`` start fast; torch is never imported here. The commands
that live in other modules (``_register_plugins``) are loaded only when a command outside this
file is asked for, or the command list is shown, so a read such as ``status`` imports click, the
store's read path and the renderer, nothing more (no signing key, no workflow table).
Exit codes: 0 done/progressed, 1 failed or rule broken, 2 bad usage, 3 human, 4 agent.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    # NOTE: `python -m orchestrator.cli` would otherwise run this file twice: once as __main__ and
    # once as orchestrator.cli when a plugin imports it, registering every command twice.
    from orchestrator.cli import main as _main

    sys.exit(_main())

import functools
import os
import signal
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
        from orchestrator.trail.store import RunStore

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
            signal.signal(signal.SIGTERM, _stop_on_sigterm)
            try:
                code = func(settings, **params)
            except (OrchestratorError, OSError) as exc:
                _exit_with_error(settings, exc)
            except KeyboardInterrupt as exc:
                name = getattr(exc, "signal_name", "SIGINT")
                print(f"stopped by {name}; the trail records it and keeps everything recorded so far "
                      "(`orchestrator advance` picks up the interrupted phase)", file=sys.stderr)
                sys.exit(143 if name == "SIGTERM" else 130)
            sys.exit(code or EXIT_OK)

        return wrapper

    return decorate


class CommandStopped(KeyboardInterrupt):
    """SIGTERM (what `timeout` and service managers send) ends a command like Ctrl-C does."""

    signal_name = "SIGTERM"


def _stop_on_sigterm(signum: int, frame: Any) -> None:
    raise CommandStopped()


def _exit_with_error(settings: _Settings, exc: BaseException) -> None:
    """One line on stderr (a JSON error under --json) and exit 2 (or the error's own code)."""
    import errno

    from orchestrator.render import emit_error

    if isinstance(exc, OSError) and not isinstance(exc, OrchestratorError):
        if exc.errno != errno.ENAMETOOLONG:
            raise exc
        exc = UsageError(f"a name is longer than the file system allows: {str(exc.filename)[:80]!r}...")
    if settings.debug:
        import traceback

        traceback.print_exc()
    assert isinstance(exc, OrchestratorError)
    emit_error(exc.code, exc.message.splitlines()[0] if exc.exit_code == EXIT_USAGE else exc.message,
               as_json=settings.as_json)
    sys.exit(exc.exit_code)


class _Main(click.Group):
    """The command group; click's own usage errors become one line (or a JSON error) and exit 2.

    Commands of other modules are registered the first time a name this file does not define is
    looked up, or the whole list is shown (``--help``): the commands and the help are as before.
    """

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:
            _register_plugins()
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        _register_plugins()
        return super().list_commands(ctx)

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        as_json = "--json" in argv
        try:
            _check_utf8(argv)
            code = super().main(argv, prog_name=prog_name, complete_var=complete_var, standalone_mode=False,
                                **extra)
        except click.exceptions.Abort:
            sys.exit(130)
        except click.ClickException as exc:
            from orchestrator.render import emit_error

            emit_error("bad_input", " ".join(exc.format_message().split()), as_json=as_json)
            sys.exit(EXIT_USAGE)
        except UsageError as exc:
            from orchestrator.render import emit_error

            emit_error(exc.code, exc.message, as_json=as_json)
            sys.exit(EXIT_USAGE)
        sys.exit(code if isinstance(code, int) else EXIT_OK)


def _check_utf8(argv: list[str]) -> None:
    """Arguments the OS handed over as bytes that are not UTF-8 (lone surrogates) are refused."""
    for index, arg in enumerate(argv, start=1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            shown = arg.encode("utf-8", "backslashreplace").decode("ascii", "replace")[:80]
            raise UsageError(f"argument {index} ({shown}) is not valid UTF-8") from None


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """orchestrator: torchtitan agent skills as persisted, auditable state machines."""


def print_outcome(settings: _Settings, outcome: Any) -> int:
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
    return print_outcome(settings, outcome)


@command(main, "advance")
@click.argument("run_id")
@click.option("--max-phases", type=click.IntRange(min=1), default=None, help="Stop after N phase attempts.")
def advance_cmd(settings: _Settings, run_id: str, max_phases: int | None) -> int:
    """Run phases until RUN is done or waits on an agent or a human."""
    from orchestrator import engine

    outcome = engine.advance(run_id, store=settings.store(), progress=settings.progress(), max_phases=max_phases)
    return print_outcome(settings, outcome)


@command(main, "resume")
@click.argument("run_id")
@click.option("--answer", "answers", multiple=True, metavar="KEY=VALUE", help="Answer a pending question.")
@click.option("--results", metavar="DIR", default=None,
              help="Hand back the current phase's work run elsewhere (e.g. a job's logs).")
@click.option("--waive", "waive", multiple=True, metavar="CODE",
              help="Waive a finding of the current phase (a person's call, recorded; needs --reason).")
@click.option("--reason", default=None, metavar="TEXT", help="Why the waived finding does not block the run.")
def resume_cmd(settings: _Settings, run_id: str, answers: tuple[str, ...], results: str | None,
               waive: tuple[str, ...], reason: str | None) -> int:
    """Answer pending questions of RUN (validated first), waive findings, hand back results, then advance."""
    from orchestrator import engine

    parsed = {}
    for item in answers:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--answer {item!r} must look like KEY=VALUE")
        parsed[key.strip()] = value
    if waive and not (reason or "").strip():
        raise UsageError("--waive needs --reason TEXT: a waiver says why the finding does not block the run")
    outcome = engine.resume(run_id, parsed, store=settings.store(), progress=settings.progress(),
                            results=Path(results) if results else None,
                            waivers={code: reason or "" for code in waive})
    return print_outcome(settings, outcome)


@command(main, "status")
@click.argument("run_id", required=False)
def status_cmd(settings: _Settings, run_id: str | None) -> int:
    """Show one run, or all runs."""
    from orchestrator.render import emit_json, status_text, status_view
    from orchestrator.trail.snapshot import exit_code_for

    if run_id is None:
        return _print_runs(settings)
    state = settings.store().read_state(run_id)
    live = _jobs_now(state)
    if settings.as_json:
        emit_json({**status_view(state), **({"jobs": live} if live else {})})
    else:
        print(status_text(state) + "".join(f"\njob      {j['key']} (job {j['job_id']}): {j['state']} {j['reason']}"
                                           for j in live))
    return exit_code_for(state)


def _jobs_now(state: dict[str, Any]) -> list[dict[str, Any]]:
    """A run waiting on cluster jobs: their states now (one squeue call; the cluster code only then)."""
    if state.get("awaiting") != "job":
        return []
    from orchestrator.jobs import seen_now

    return seen_now(state)


@command(main, "list")
def list_cmd(settings: _Settings) -> int:
    """List all runs (one line each)."""
    return _print_runs(settings)


def _print_runs(settings: _Settings) -> int:
    from orchestrator.render import emit_json, runs_table, status_view

    store = settings.store()
    states = [_state_or_broken(store, r) for r in store.list_run_ids()]
    if settings.as_json:
        emit_json({"runs": [status_view(s) for s in states]})
    else:
        print(runs_table(states))
    return EXIT_OK


def _state_or_broken(store: Any, run_id: str) -> dict[str, Any]:
    """The run's state; a run whose trail cannot be read is listed as broken, not fatal to the list."""
    try:
        return store.read_state(run_id)
    except OrchestratorError as exc:
        return {"run_id": run_id, "workflow": "?", "phase": "?", "status": "broken", "awaiting": None,
                "summary": exc.message.splitlines()[0]}


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


@command(main, "abort")
@click.argument("run_id")
@click.option("--reason", required=True, help="Why the run stops (recorded).")
def abort_cmd(settings: _Settings, run_id: str, reason: str) -> int:
    """Stop RUN for good, recording why."""
    from orchestrator import engine

    return print_outcome(settings, engine.abort(run_id, reason, store=settings.store()))


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


_PLUGINS_LOADED: list[bool] = []


def _register_plugins() -> None:
    """Commands that live in their own modules: submissions and the patch ledger, agent and mcp, and the
    commands workflows add (registered beside the workflows in ``orchestrator.workflow``). Once per process."""
    import importlib

    if _PLUGINS_LOADED:
        return
    _PLUGINS_LOADED.append(True)
    from orchestrator.workflow import BUILTIN_COMMANDS

    for module in ("orchestrator.cli_extra", "orchestrator.cli_agent", "orchestrator.cli_trail", *BUILTIN_COMMANDS):
        try:
            importlib.import_module(module).register(main, command)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise


__all__ = ["EXIT_USAGE", "main"]
