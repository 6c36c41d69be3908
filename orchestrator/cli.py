"""Thin command line: parse, call the engine, render with rich text or ``--json``.

Heavy modules (the engine, pydantic models, GitPython, phases) are imported inside the
commands so that ``status`` and ``audit`` start fast; torch is never imported here. The commands
that live in other modules (``_register_plugins``) are loaded only when a command outside this
file is asked for, or the command list is shown. What commands share without click (settings, the
error handler, printing an outcome, parsing workflow options, ``status`` itself) is ``cli_base``,
which also runs a plainly spelled ``status`` without importing click at all (the console script,
``console.entry``): a read loads the store's read path and the renderer, nothing more.
Exit codes: 0 done/progressed, 1 failed or rule broken, 2 bad usage, 3 human, 4 agent.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    # NOTE: `python -m orchestrator.cli` would otherwise run this file twice: once as __main__ and
    # once as orchestrator.cli when the console script imports it, defining every command twice.
    from orchestrator.console import entry

    entry()

import functools
from pathlib import Path
from typing import Any, Callable

import click

from orchestrator.cli_base import (
    DEFAULT_STATE_DIR, CommandStopped, Settings, parse_extra_options, print_outcome, print_runs, run_command, status,
)
from orchestrator.errors import EXIT_OK, EXIT_USAGE, UsageError


def common_options(func: Callable) -> Callable:
    """--json, --state-dir, --as and --debug: taken before the command (by the group) and after it (by each one)."""
    func = click.option("--debug", is_flag=True, help="Show tracebacks.")(func)
    func = click.option("--as", "acting_as", metavar="NAME", default=None,
                        help="Your name, recorded on what you do beside the OS user and host (env ORCHESTRATOR_AS; "
                             "self-reported, not checked).")(func)
    func = click.option("--state-dir", metavar="DIR", help="Runs live in DIR/runs (env ORCHESTRATOR_STATE_DIR).")(func)
    return click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")(func)


def _settings(*, as_json: bool, state_dir: str | None, debug: bool, acting_as: str | None = None) -> Settings:
    """The command's own options merged with those given before the command (``main``'s)."""
    given = click.get_current_context().find_root().obj or {}
    _given_once("--state-dir", given.get("state_dir"), state_dir)
    _given_once("--as", given.get("acting_as"), acting_as)
    return Settings(as_json=as_json or given.get("as_json", False), state_dir=state_dir or given.get("state_dir"),
                    debug=debug or given.get("debug", False), acting_as=acting_as or given.get("acting_as"))


def _given_once(option: str, before: str | None, after: str | None) -> None:
    if after is not None and before is not None and after != before:
        raise UsageError(f"{option} given twice: {before!r} before the command, {after!r} after it; give it once")


def command(group: click.Group, name: str, **kwargs: Any) -> Callable:
    """Register a command with the options every command takes, and one error handler."""

    def decorate(func: Callable) -> Callable:
        @group.command(name, **kwargs)
        @common_options
        @functools.wraps(func)
        def wrapper(as_json: bool, state_dir: str | None, debug: bool, acting_as: str | None, **params: Any) -> None:
            run_command(func, _settings(as_json=as_json, state_dir=state_dir, debug=debug, acting_as=acting_as),
                        params)

        return wrapper

    return decorate


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
@common_options
@click.pass_context
def main(ctx: click.Context, as_json: bool, state_dir: str | None, debug: bool, acting_as: str | None) -> None:
    """orchestrator: torchtitan agent skills as persisted, auditable state machines.

    --json, --state-dir, --as and --debug go before the command or after it.
    """
    ctx.obj = {"as_json": as_json, "state_dir": state_dir, "debug": debug, "acting_as": acting_as}


_EXTRA = {"ignore_unknown_options": True, "allow_extra_args": True}


@command(main, "start", context_settings=_EXTRA)
@click.argument("workflow")
def start_cmd(settings: Settings, workflow: str) -> int:
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
def run_cmd(settings: Settings, workflow: str) -> int:
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
def advance_cmd(settings: Settings, run_id: str, max_phases: int | None) -> int:
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
@click.option("--no-advance", "no_advance", is_flag=True,
              help="Record the answers, waivers and results only; the run waits for the next `advance`.")
def resume_cmd(settings: Settings, run_id: str, answers: tuple[str, ...], results: str | None,
               waive: tuple[str, ...], reason: str | None, no_advance: bool) -> int:
    """Answer pending questions of RUN (validated first), waive findings, hand back results, then advance
    (unless --no-advance)."""
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
                            waivers={code: reason or "" for code in waive}, advance_after=not no_advance)
    return print_outcome(settings, outcome)


@command(main, "status")
@click.argument("run_id", required=False)
def status_cmd(settings: Settings, run_id: str | None) -> int:
    """Show one run, or all runs."""
    return status(settings, run_id)


@command(main, "list")
def list_cmd(settings: Settings) -> int:
    """List all runs (one line each)."""
    return print_runs(settings)


@command(main, "show")
@click.argument("run_id")
@click.option("--events", "last_events", default=20, show_default=True, help="How many recent events.")
@click.option("--seq", "seqs", multiple=True, type=click.IntRange(min=0), metavar="N",
              help="Print event N whole (repeatable): what a report's \"seq N\" points to.")
def show_cmd(settings: Settings, run_id: str, last_events: int, seqs: tuple[int, ...]) -> int:
    """Show RUN for a person: where it stands, who did what (every act), questions, issues, recent events,
    artifacts (--json: the snapshot, the recent events and the acts)."""
    from orchestrator.render import emit_json
    from orchestrator.show import acts, changes, show_text

    store = settings.store()
    state, events = store.read_state(run_id), store.read_events(run_id)
    if seqs:
        return _show_events(settings, run_id, events, seqs)
    recent = events[-last_events:] if last_events > 0 else []
    if settings.as_json:
        changed = [{"seq": e["seq"], "type": e["type"], "actor": e["actor"], "who": e.get("who"), "files": files}
                   for e, files in changes(events)]
        emit_json({"run": state, "events": recent, "acts": acts(events), "changes": changed,
                   "inputs": events[0]["data"].get("inputs") or [], "signer": events[0]["data"].get("signer")})
        return EXIT_OK
    print(show_text(state, events, recent=last_events, state_dir=str(store.state_dir)))
    return EXIT_OK


def _show_events(settings: Settings, run_id: str, events: list[dict[str, Any]], seqs: tuple[int, ...]) -> int:
    import json

    from orchestrator.render import emit_json

    missing = [seq for seq in seqs if seq >= len(events)]
    if missing:
        raise UsageError(f"run {run_id} has no event seq {missing[0]} (its last is seq {len(events) - 1})")
    chosen = [events[seq] for seq in seqs]
    if settings.as_json:
        emit_json({"run_id": run_id, "events": chosen})
    else:
        print("\n".join(json.dumps(event, indent=2, sort_keys=True, ensure_ascii=False) for event in chosen))
    return EXIT_OK


@command(main, "abort")
@click.argument("run_id")
@click.option("--reason", required=True, help="Why the run stops (recorded).")
def abort_cmd(settings: Settings, run_id: str, reason: str) -> int:
    """Stop RUN for good, recording why."""
    from orchestrator import engine

    return print_outcome(settings, engine.abort(run_id, reason, store=settings.store()))


@command(main, "graph")
@click.argument("workflow")
def graph_cmd(settings: Settings, workflow: str) -> int:
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
    """Commands that live in their own modules: submissions and the patch ledger, agent and mcp, the trail's,
    ``fixes``, and the commands workflows add (registered beside the workflows in ``orchestrator.workflow``).
    Once per process."""
    import importlib

    if _PLUGINS_LOADED:
        return
    _PLUGINS_LOADED.append(True)
    from orchestrator.workflow import BUILTIN_COMMANDS

    for module in ("orchestrator.cli_extra", "orchestrator.cli_agent", "orchestrator.cli_trail",
                   "orchestrator.cli_fixes", *BUILTIN_COMMANDS):
        try:
            importlib.import_module(module).register(main, command)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise


__all__ = ["DEFAULT_STATE_DIR", "EXIT_USAGE", "CommandStopped", "main"]
