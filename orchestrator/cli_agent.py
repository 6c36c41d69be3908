"""CLI commands for agents: ``mcp`` (tool server on stdio), ``agent`` (our Anthropic loop) and
``check-path`` (a Claude Code PreToolUse hook that refuses edits outside the phase's scope).

Registered by ``orchestrator.cli._register_plugins``. ``mcp`` and ``anthropic`` are imported
inside the commands, so ``import orchestrator.cli`` stays free of them.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Callable

import click

from orchestrator.errors import EXIT_OK, EXIT_USAGE

HOOK_PATH_KEYS = ("file_path", "notebook_path", "path")
EDIT_TOOLS = frozenset({"Edit", "MultiEdit", "Write", "NotebookEdit"})


def register(main: click.Group, command: Callable[..., Callable]) -> None:
    @command(main, "mcp")
    def mcp_cmd(settings: Any) -> int:
        """Serve the agent tools over MCP on stdio (for Claude Code and other MCP clients)."""
        from orchestrator.agent.mcp_server import serve_stdio

        serve_stdio(settings.store())
        return EXIT_OK

    @command(main, "agent")
    @click.argument("run_id")
    @click.option("--model", default=None, metavar="NAME",
                  help="Anthropic model (env ORCHESTRATOR_AGENT_MODEL; default claude-sonnet-5-5).")
    @click.option("--max-turns", default=30, show_default=True, type=int, help="Stop after N model turns.")
    def agent_cmd(settings: Any, run_id: str, model: str | None, max_turns: int) -> int:
        """Drive RUN with our own Anthropic tool-use loop (key from ANTHROPIC_API_KEY)."""
        import os

        from orchestrator.agent.driver import DEFAULT_MODEL, build_client, drive

        client = build_client()
        result = drive(run_id, store=settings.store(), client=client, progress=settings.progress(),
                       model=model or os.environ.get("ORCHESTRATOR_AGENT_MODEL") or DEFAULT_MODEL,
                       max_turns=max_turns)
        _print_drive(settings, result)
        return result.exit_code

    @command(main, "check-path")
    @click.argument("run_id")
    @click.argument("file", required=False)
    def check_path_cmd(settings: Any, run_id: str, file: str | None) -> int:
        """Exit 0 if FILE may be edited in RUN's current phase, else 2 with the reason on stderr.

        Without FILE (or with "-") the path is read from a Claude Code hook's JSON on stdin
        (tool_input.file_path), so the command works as a PreToolUse hook as is.
        """
        from orchestrator.agent.files import ScopeRefused, check_writable
        from orchestrator.agent.tools import _scope

        try:
            path = file if file and file != "-" else _hook_path(sys.stdin.read())
            if path is None:
                return EXIT_OK
            check_writable(_scope(settings.store().read_state(run_id)), path)
        except ScopeRefused as exc:
            print(f"orchestrator: refused: {exc.message}", file=sys.stderr)
            return EXIT_USAGE
        return EXIT_OK


def _hook_path(payload: str) -> str | None:
    """The edited path from a PreToolUse hook payload; None for a tool that edits no file.

    Fails closed: a payload that is not JSON, lacks tool_name/tool_input, or an editing tool
    whose payload names no file path, is refused.
    """
    from orchestrator.agent.files import ScopeRefused

    try:
        tool_input = json.loads(payload).get("tool_input")
    except (ValueError, AttributeError):
        raise ScopeRefused("the hook payload is not a JSON object; refusing the edit") from None
    tool = json.loads(payload).get("tool_name")
    if not isinstance(tool, str) or not tool or not isinstance(tool_input, dict):
        raise ScopeRefused("the hook payload has no tool_name and tool_input object; refusing the edit")
    path = next((tool_input[k] for k in HOOK_PATH_KEYS if k in tool_input), None)
    if path is None and tool not in EDIT_TOOLS:
        return None  # a tool that edits no file (the hook's matcher let it through)
    if not isinstance(path, str) or not path:
        raise ScopeRefused(f"the hook payload names no file to edit ({', '.join(HOOK_PATH_KEYS)}); refusing the edit")
    return path


def _print_drive(settings: Any, result: Any) -> None:
    from orchestrator.render import emit_json, status_text, status_view

    summary = {"stop_reason": result.stop_reason, "turns": result.turns, "tool_calls": result.tool_calls,
               "transcript": result.transcript}
    if settings.as_json:
        emit_json({**status_view(result.state), "agent": summary})
        return
    print(f"agent stopped: {result.stop_reason} after {result.turns} turn(s), {result.tool_calls} tool call(s); "
          f"transcript artifacts/{result.transcript}", file=sys.stderr)
    print(status_text(result.state))
