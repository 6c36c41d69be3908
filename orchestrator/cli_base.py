"""What every CLI command shares, without click: settings, the one error handler, printing an outcome,
parsing workflow options, and the reads.

``status`` is the command people and agents poll, so it must start in about the time Python
itself does. ``run_plain_status`` takes the common spelling, ``status [RUN] [--json]
[--state-dir DIR] [--debug]`` in any order, each at most once, and runs the very function the
click command runs (``status``) through the same handler (``run_command``), without importing
click. Anything else (``--help``, an unknown or repeated option, a second argument, a value that
starts with '-', text that is not UTF-8) is left to click, so help and usage errors read exactly
as before. ``cli.py`` registers the same functions as click commands.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any, Callable

from orchestrator.errors import EXIT_OK, EXIT_USAGE, OrchestratorError, UsageError

DEFAULT_STATE_DIR = "state"
_FLAGS = {"--json": "as_json", "--debug": "debug"}


class Settings:
    """The options every command takes (``--json``, ``--state-dir``, ``--debug``) and what follows from them."""

    def __init__(self, *, as_json: bool, state_dir: str | None, debug: bool, acting_as: str | None = None) -> None:
        self.as_json = as_json
        self.state_dir = Path(state_dir or os.environ.get("ORCHESTRATOR_STATE_DIR") or DEFAULT_STATE_DIR)
        self.debug = debug or os.environ.get("ORCHESTRATOR_DEBUG") == "1"
        self.acting_as = acting_as

    def store(self) -> Any:
        """The runs; what a person does through this command is recorded as theirs (``--as NAME`` beside the
        OS user and host)."""
        from orchestrator.trail.store import RunStore

        if self.acting_as is None:
            return RunStore(self.state_dir)
        from orchestrator.trail.identity import person

        return RunStore(self.state_dir, who={"human": person(self.acting_as)})

    def progress(self) -> Callable[[Any], None]:
        """Prints each progress line (a ``progress.Update`` or a plain string) on stderr."""
        if self.as_json:
            return lambda _message: None
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.markup import escape

            console = Console(stderr=True)
            return lambda message: console.print(f"[dim]… {escape(str(message))}[/dim]", highlight=False)
        return lambda message: print(f"... {message}", file=sys.stderr, flush=True)


class CommandStopped(KeyboardInterrupt):
    """SIGTERM (what `timeout` and service managers send) ends a command like Ctrl-C does."""

    signal_name = "SIGTERM"


def _stop_on_sigterm(signum: int, frame: Any) -> None:
    raise CommandStopped()


def run_command(func: Callable[..., int | None], settings: Settings, params: dict[str, Any]) -> None:
    """Run one command and exit with its code; errors become one line (or a JSON error)."""
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        code = func(settings, **params)
    except (OrchestratorError, OSError) as exc:
        exit_with_error(settings, exc)
    except KeyboardInterrupt as exc:
        name, seq = getattr(exc, "signal_name", "SIGINT"), getattr(exc, "recorded_seq", None)
        if seq is None:
            print(f"stopped by {name}; nothing was recorded of the stop (no phase was running); what the trail held "
                  "before stays as it was", file=sys.stderr)
        else:
            print(f"stopped by {name}; the trail records it (command_interrupted seq {seq}) and keeps everything "
                  "recorded so far (`orchestrator advance` picks up the interrupted phase)", file=sys.stderr)
        sys.exit(143 if name == "SIGTERM" else 130)
    sys.exit(code or EXIT_OK)


def exit_with_error(settings: Settings, exc: BaseException) -> None:
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


def status(settings: Settings, run_id: str | None) -> int:
    """Show one run, or all runs."""
    from orchestrator.render import emit_json, status_text, status_view
    from orchestrator.trail.snapshot import exit_code_for

    if run_id is None:
        return print_runs(settings)
    state = settings.store().read_state(run_id)
    live = _jobs_now(state)
    if settings.as_json:
        emit_json({**status_view(state), **({"jobs": live} if live else {})})
    else:
        print(status_text(state) + "".join(f"\njob      {j['key']} (job {j['job_id']}): {j['state']} {j['reason']}"
                                           for j in live))
    return exit_code_for(state)


def print_outcome(settings: Settings, outcome: Any) -> int:
    from orchestrator.render import emit_json, status_text, status_view

    if settings.as_json:
        emit_json({**status_view(outcome.state), **outcome.details})
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


def _jobs_now(state: dict[str, Any]) -> list[dict[str, Any]]:
    """A run waiting on cluster jobs: their states now (one squeue call; the cluster code only then)."""
    if state.get("awaiting") != "job":
        return []
    from orchestrator.jobs import seen_now

    return seen_now(state)


def print_runs(settings: Settings) -> int:
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


def plain_status_args(argv: list[str]) -> dict[str, Any] | None:
    """The options of a plainly spelled ``status`` command line, or None to leave it to click."""
    if not argv or argv[0] != "status":
        return None
    found: dict[str, Any] = {}
    rest = iter(argv[1:])
    for arg in rest:
        if not arg or not _is_utf8(arg):
            return None
        name, value = arg, None
        if arg.startswith("--state-dir="):
            name, value = "--state-dir", arg[len("--state-dir="):]
        elif arg == "--state-dir":
            value = next(rest, None)
        key = "state_dir" if name == "--state-dir" else _FLAGS.get(name, "run_id" if arg[0] != "-" else None)
        if key is None or key in found or (name == "--state-dir" and (not value or value[0] == "-" or
                                                                     not _is_utf8(value))):
            return None
        found[key] = value if name == "--state-dir" else (arg if key == "run_id" else True)
    return found


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def run_plain_status(argv: list[str]) -> None:
    """Run a plainly spelled ``status`` without click (exits); return at once for anything else."""
    found = plain_status_args(argv)
    if found is None:
        return
    settings = Settings(as_json=found.get("as_json", False), state_dir=found.get("state_dir"),
                        debug=found.get("debug", False))
    run_command(status, settings, {"run_id": found.get("run_id")})
