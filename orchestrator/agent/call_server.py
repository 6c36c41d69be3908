"""Every MCP tool call in a process of its own, forked from one process that imported the tool set once.

Tool calls on different runs go on at once, and the phase code they run is not safe in threads:
CPython 3.11 builds AST objects with counters shared by the whole interpreter, so two threads in
``ast.parse`` at once (the add-moe-model guards, pydantic reading attribute docstrings) fail with
"SystemError: AST constructor recursion depth mismatch"; ``subprocess``'s ``preexec_fn``, which
the worker runner uses, may hang a child forked while another thread holds a lock. So no tool runs
in the MCP server's threads. ``CallServer.start`` (called on the server's event-loop thread, before
the first call) starts ``serve``, a process that imports the tools and every workflow and never
starts a thread; for each call it forks a child that runs ``tools.call_tool`` as a CLI process
would, and the child writes the call's progress and its answer back on the call's socket as JSON
lines. Calls on the same run meet at the run's lock, as two CLI processes do: one acts, the others
are refused as busy. A fork costs ~10 ms more than a call in a thread; a fresh interpreter per call
costs 0.3-0.6 s of imports (docs/agents.md, "Many runs at once").

When the MCP server goes, the call server gets SIGTERM and so do its children, which the engine
records as an interruption (``command_interrupted``), as for a CLI stopped by SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import Any, Awaitable, Callable

MAX_LINE = 64 << 20
"""The longest line a call may send back (a read_file or read_artifact answer is at most ~60,000 chars)."""
REAP_EVERY_S = 1.0


def serve(socket_path: str, state_dir: str, parent: int) -> None:
    """Import the tool set, then fork one child per connection on ``socket_path``; never returns."""
    from orchestrator.worker_main import set_death_signal

    set_death_signal(signal.SIGTERM)
    if os.getppid() != parent:  # the MCP server died before the death signal was armed
        return
    _preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    listener.settimeout(REAP_EVERY_S)
    print(json.dumps({"ready": True}), flush=True)
    os.dup2(2, 1)  # what a call prints goes to the server's log, never into the pipe nobody reads after this line
    while True:
        _reap()
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        pid = os.fork()
        if pid == 0:
            listener.close()
            os._exit(_child(conn, state_dir, server=os.getppid()))
        conn.close()


def _preload() -> None:
    """What a call would import first: the tools, the engine and every workflow's table and phase modules."""
    import orchestrator.agent.tools  # noqa: F401
    import orchestrator.engine  # noqa: F401
    from orchestrator.workflow import load_workflow, workflow_refs

    for name in workflow_refs():
        try:
            load_workflow(name)
        except Exception:  # noqa: BLE001 - a broken workflow is reported by the calls that name it
            pass


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _child(conn: socket.socket, state_dir: str, *, server: int) -> int:
    """Run the one call that arrives on ``conn``; its progress lines and its answer go back on ``conn``."""
    from orchestrator.agent.tools import call_tool
    from orchestrator.cli_base import CommandStopped
    from orchestrator.trail.store import RunStore
    from orchestrator.worker_main import set_death_signal

    def stop(_signum: int, _frame: Any) -> None:
        raise CommandStopped()

    signal.signal(signal.SIGTERM, stop)
    set_death_signal(signal.SIGTERM)
    if os.getppid() != server:
        return 1
    conn.settimeout(None)
    lines = _Lines(conn)
    with conn.makefile("rb") as incoming:
        request = json.loads(incoming.readline(MAX_LINE))
    try:
        result = call_tool(request["tool"], request["arguments"], store=RunStore(Path(state_dir)),
                           call_id=request["call_id"], progress=lines.progress, who=request.get("who"))
    except BaseException as exc:  # noqa: BLE001 - a bug (recorded by call_tool) or SIGTERM: said, then logged
        traceback.print_exc()
        lines.send({"bug": f"{type(exc).__name__}: {' '.join(str(exc).split())[:2000]}"})
        return 1
    lines.send({"result": {"status": result.status, "message": result.message, "data": result.data,
                           "text": result.text}})
    return 0


class _Lines:
    """JSON lines to the MCP server, from the call's thread and from the threads that read worker logs."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn, self.lock = conn, threading.Lock()

    def send(self, body: dict[str, Any]) -> None:
        data = json.dumps(body, default=str).encode() + b"\n"
        with self.lock:
            try:
                self.conn.sendall(data)
            except OSError:  # the client went away (cancelled the call): the call goes on, recorded as ever
                pass

    def progress(self, update: Any) -> None:
        self.send({"progress": _progress_fields(update)})


def _progress_fields(update: Any) -> dict[str, Any]:
    fields = getattr(update, "fields", None)
    return fields() if callable(fields) else {"message": str(update)}


class CallServer:
    """The MCP server's side: starts ``serve`` and runs each call in it."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        self.proc: subprocess.Popen | None = None
        self.tmp: tempfile.TemporaryDirectory | None = None

    @property
    def socket_path(self) -> str:
        assert self.tmp is not None, "CallServer.start() first"
        return str(Path(self.tmp.name, "calls.sock"))

    def start(self) -> None:
        """Start the call server and wait until it serves (call this on the thread that lives as long as the
        MCP server: the call server dies with the thread that started it)."""
        self.stop()
        self.tmp = tempfile.TemporaryDirectory(prefix="orchestrator-calls-")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.agent.call_server", self.socket_path, str(self.state_dir),
             str(os.getpid())], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        if not ready.startswith(b'{"ready": true}'):
            code = self.proc.wait()
            raise RuntimeError(f"the MCP server's call process did not start (exit {code}); see its stderr")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait()
        if self.tmp is not None:
            self.tmp.cleanup()
        self.proc = self.tmp = None

    async def call(self, tool: str, arguments: dict[str, Any], *, call_id: str, who: dict[str, Any] | None = None,
                   on_progress: Callable[[dict[str, Any]], Awaitable[None]]) -> Any:
        """The call's ``ToolResult``; its progress lines go to ``on_progress`` as they come. ``who``: the MCP client
        as it named itself, recorded on the call's acts."""
        import anyio

        if self.proc is None or self.proc.poll() is not None:
            self.start()  # gone (killed, out of memory): a new one serves the calls from now on
        request = json.dumps({"tool": tool, "arguments": arguments, "call_id": call_id, "who": who}).encode() + b"\n"
        async with await anyio.connect_unix(self.socket_path) as stream:
            await stream.send(request)
            return await _answer(stream, tool, on_progress)


async def _answer(stream: Any, tool: str, on_progress: Callable[[dict[str, Any]], Awaitable[None]]) -> Any:
    import anyio
    from anyio.streams.buffered import BufferedByteReceiveStream

    from orchestrator.agent.tool_args import ToolResult

    reader = BufferedByteReceiveStream(stream)
    while True:
        try:
            line = await reader.receive_until(b"\n", MAX_LINE)
        except (anyio.IncompleteRead, anyio.EndOfStream):
            return ToolResult(status="error", message=(
                f"{tool}: the call's process ended without an answer (killed?); what it recorded is in the trail "
                "(`orchestrator show RUN`)"))
        body = json.loads(line)
        if "progress" in body:
            await on_progress(body["progress"])
        elif "result" in body:
            return ToolResult(**body["result"])
        else:
            raise CallFailed(body["bug"])


class CallFailed(RuntimeError):
    """A bug stopped the call in its process (recorded in the run's trail; the traceback is on stderr)."""


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2], int(sys.argv[3]))
