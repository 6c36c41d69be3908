"""``orchestrator mcp``: the agent tool set over MCP (stdio), with ``mcp.server.mcpserver.MCPServer``.

Each entry of ``tools.TOOLS`` becomes one MCP tool whose input schema is the tool's own
argument schema (no ``anyOf``), not one inferred from a Python signature. Arguments reach
``tools.call_tool`` untouched, so a malformed call is refused and recorded by the same
dispatcher our Anthropic loop uses. Handlers run in a worker thread; a phase's progress
lines (the ones the CLI prints, the workers' steps and ETAs) become MCP progress
notifications (when the client sent a progress token). Logs go to stderr only: stdout
carries the protocol.
"""

from __future__ import annotations

import secrets
import threading
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.tools.base import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import ConfigDict

from orchestrator.agent.tools import TOOLS, ToolSpec, call_tool

INSTRUCTIONS = (
    "Drive orchestrator runs: list_runs or start_run, then explain (why the run waits, what the phase found, "
    "where fixes go, which paths may be edited), fix inside the allowed paths, advance (one phase per call). "
    "Questions for a human only are refused by answer; escalate asks a person. Every call is recorded."
)
_READ_ONLY = {"status", "list_runs", "read_artifact", "explain", "read_file"}


class _RawArguments(ArgModelBase):
    """Hands the call's arguments over as one dict: ``tools.call_tool`` validates and records them."""

    model_config = ConfigDict(extra="allow", arbitrary_types_allowed=True)

    def model_dump_one_level(self) -> dict[str, Any]:
        return {"arguments": dict(self.model_extra or {})}


def build_server(store: Any, *, log_level: str = "WARNING") -> MCPServer:
    """An MCPServer serving every agent tool against ``store``."""
    session = secrets.token_hex(3)
    tools = [_build_tool(spec, store=store, session=session) for spec in TOOLS.values()]
    return MCPServer(name="orchestrator", instructions=INSTRUCTIONS, tools=tools, log_level=log_level)


def serve_stdio(store: Any) -> None:
    """Run the server on stdin/stdout until the client closes it."""
    build_server(store).run("stdio")


def _build_tool(spec: ToolSpec, *, store: Any, session: str) -> Tool:
    async def handle(arguments: dict[str, Any], ctx: Context) -> CallToolResult:
        call_id = f"mcp-{session}-{_request_id(ctx)}"
        progress = _progress_sender(ctx)
        who = _client_of(ctx)
        result = await anyio.to_thread.run_sync(
            lambda: call_tool(spec.name, arguments, store=store, call_id=call_id, progress=progress, who=who))
        return CallToolResult(content=[TextContent(type="text", text=block) for block in result.blocks()],
                              structured_content=result.model_dump(mode="json"), is_error=result.is_error)

    return Tool(fn=handle, name=spec.name, description=spec.description, parameters=spec.input_schema(),
                fn_metadata=FuncMetadata(arg_model=_RawArguments), is_async=True, context_kwarg="ctx",
                annotations=ToolAnnotations(read_only_hint=spec.name in _READ_ONLY))


def _progress_sender(ctx: Context) -> Any:
    """A callback that sends each progress line the CLI prints as an MCP progress notification (the client
    must send a progress token: MCP sends none otherwise). Call it from the event loop's async context: lines
    come from the tool's thread and from the threads that read worker logs, so it holds the loop's token."""
    token, lock, count = anyio.lowlevel.current_token(), threading.Lock(), 0

    def send(message: str) -> None:
        nonlocal count
        with lock:
            count += 1
            sent = count
        try:
            anyio.from_thread.run(ctx.report_progress, sent, None, message, token=token)
        except Exception:  # noqa: BLE001 (progress is best effort: a closed stream must not fail the tool)
            pass

    return send


def _client_of(ctx: Context) -> dict[str, Any]:
    """The agent as the MCP client named itself in its initialize request (clientInfo), for the trail's ``by``."""
    from orchestrator.trail.identity import mcp_client

    params = getattr(ctx.session, "client_params", None)
    info = getattr(params, "client_info", None)
    return mcp_client(getattr(info, "name", None), getattr(info, "version", None))


def _request_id(ctx: Context) -> str:
    try:
        return str(ctx.request_id)
    except Exception:  # noqa: BLE001 (outside a request there is no id)
        return secrets.token_hex(4)
