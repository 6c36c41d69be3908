"""``orchestrator mcp``: the agent tool set over MCP (stdio), with ``mcp.server.mcpserver.MCPServer``.

Each entry of ``tools.TOOLS`` becomes one MCP tool whose input schema is the tool's own
argument schema (no ``anyOf``), not one inferred from a Python signature. Arguments reach
``tools.call_tool`` untouched, so a malformed call is refused and recorded by the same
dispatcher our Anthropic loop uses. Every call runs in a process of its own
(``call_server``), so any number of calls may arrive at once: calls on different runs go on
side by side, calls on one run meet at its lock. A phase's progress lines (the ones the CLI
prints, the workers' steps and ETAs) become MCP progress notifications (when the client sent a
progress token). Logs go to stderr only: stdout carries the protocol.
"""

from __future__ import annotations

import contextlib
import secrets
from typing import Any, AsyncIterator

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.tools.base import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import ConfigDict

from orchestrator.agent.call_server import CallServer
from orchestrator.agent.tools import TOOLS, ToolSpec

INSTRUCTIONS = (
    "Drive orchestrator runs: list_runs or start_run, then explain (why the run waits, what the phase found, "
    "where fixes go, which paths may be edited), fix inside the allowed paths, advance (one phase per call). "
    "Calls on different runs may be sent at once; a second acting call on a run another call holds is refused "
    "as busy. Questions for a human only are refused by answer; escalate asks a person. Every call is recorded."
)
_READ_ONLY = {"status", "list_runs", "read_artifact", "explain", "read_file"}


class _RawArguments(ArgModelBase):
    """Hands the call's arguments over as one dict: ``tools.call_tool`` validates and records them."""

    model_config = ConfigDict(extra="allow", arbitrary_types_allowed=True)

    def model_dump_one_level(self) -> dict[str, Any]:
        return {"arguments": dict(self.model_extra or {})}


def build_server(store: Any, *, log_level: str = "WARNING") -> MCPServer:
    """An MCPServer serving every agent tool against ``store``; its call process starts with the server."""
    session = secrets.token_hex(3)
    calls = CallServer(store.state_dir)

    @contextlib.asynccontextmanager
    async def serving(_app: MCPServer) -> AsyncIterator[dict[str, Any]]:
        calls.start()  # on the event loop's thread, which lives as long as the server
        try:
            yield {}
        finally:
            calls.stop()

    tools = [_build_tool(spec, calls=calls, session=session) for spec in TOOLS.values()]
    return MCPServer(name="orchestrator", instructions=INSTRUCTIONS, tools=tools, log_level=log_level,
                     lifespan=serving)


def serve_stdio(store: Any) -> None:
    """Run the server on stdin/stdout until the client closes it."""
    build_server(store).run("stdio")


def _build_tool(spec: ToolSpec, *, calls: CallServer, session: str) -> Tool:
    async def handle(arguments: dict[str, Any], ctx: Context) -> CallToolResult:
        call_id = f"mcp-{session}-{_request_id(ctx)}"
        result = await calls.call(spec.name, arguments, call_id=call_id, who=_client_of(ctx),
                                  on_progress=_progress_sender(ctx))
        return CallToolResult(content=[TextContent(type="text", text=block) for block in result.blocks()],
                              structured_content=result.model_dump(mode="json"), is_error=result.is_error)

    return Tool(fn=handle, name=spec.name, description=spec.description, parameters=spec.input_schema(),
                fn_metadata=FuncMetadata(arg_model=_RawArguments), is_async=True, context_kwarg="ctx",
                annotations=ToolAnnotations(read_only_hint=spec.name in _READ_ONLY))


def _progress_sender(ctx: Context) -> Any:
    """Sends each progress line of the call as an MCP progress notification (the client must send a progress
    token: MCP sends none otherwise): ``progress`` is the steps finished in the call, ``total`` its planned steps
    (None where the phase cannot know them), the message the line the CLI prints, with the step and the ETA."""
    track = _CallProgress()

    async def send(line: dict[str, Any]) -> None:
        value, total = track.place(line)
        try:
            await ctx.report_progress(value, total, line.get("text") or line.get("message", ""))
        except Exception:  # noqa: BLE001 (progress is best effort: a closed stream must not fail the tool)
            pass

    return send


class _CallProgress:
    """Where a call stands over the phases it runs (``submit`` of a candidate runs several): each phase's steps
    add to those of the phases before it. MCP wants ``progress`` to rise with every notification, so a line that
    finished nothing new moves it by a ten-thousandth of a step."""

    NUDGE = 1e-4

    def __init__(self) -> None:
        self.before, self.phase, self.extent, self.sent = 0.0, None, 0.0, 0.0

    def place(self, line: dict[str, Any]) -> tuple[float, float | None]:
        if line.get("phase") != self.phase:
            self.before, self.phase, self.extent = self.before + self.extent, line.get("phase"), 0.0
        done, total = float(line.get("done") or 0.0), line.get("total")
        self.extent = max(self.extent, done if total is None else float(total))
        value = max(self.before + done, self.sent + self.NUDGE)
        self.sent = value
        return value, (None if total is None else self.before + total)


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
