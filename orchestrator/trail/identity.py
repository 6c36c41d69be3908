"""Who acted: the record (``who``) the writer puts on every event a person or an agent makes.

A person (actor ``human``): the OS user and host of the process, the name given with ``--as`` (or
``ORCHESTRATOR_AS``), whether its stdin was a terminal, its command line and its parent process's
command line (a shell, a script, an agent's harness). An agent (actor ``agent``): how it reached us
(``via``: ``mcp`` with the client's name and version from its ``initialize`` request, ``anthropic``
with our loop's model, ``tools`` for an in-process call that named no client), plus the same process
facts. The engine's own events carry none.

All of it is self-reported by the process that wrote the event: it says which process, run by which
OS account, on which host, claimed what, and it is inside the hash chain and under the run's signature
from then on. It does not authenticate anyone: a script can pass ``--as`` any name, an MCP client can
send any name, and whoever holds the signing key can write any record. docs/auditing.md says so.
Computed once per process: every field but ``as``, ``via``, ``client`` and ``model`` is the process's own.
"""

from __future__ import annotations

import os
import sys
from typing import Any

PERSON, AGENT = "person", "agent"
AS_ENV = "ORCHESTRATOR_AS"
MAX_COMMAND = 300
_PROCESS: dict[str, Any] = {}


def process() -> dict[str, Any]:
    """The facts of this process that every record shares (read once per process: a forked child reads its own)."""
    if _PROCESS.get("pid") != os.getpid():
        import getpass
        import socket

        _PROCESS.update(user=getpass.getuser(), host=socket.gethostname(), pid=os.getpid(),
                        tty=_isatty(sys.stdin), command=_command(), parent=_parent_command())
    return dict(_PROCESS)


def person(name: str | None = None) -> dict[str, Any]:
    """A person acting through this process; ``name`` from ``--as`` (else ``ORCHESTRATOR_AS``)."""
    name = (name or os.environ.get(AS_ENV) or "").strip()
    return {"kind": PERSON, **({"as": name[:200]} if name else {}), **process()}


def mcp_client(name: str | None, version: str | None) -> dict[str, Any]:
    """An agent through ``orchestrator mcp``: the client names itself in its initialize request (clientInfo)."""
    return {"kind": AGENT, "via": "mcp", "client": {"name": str(name or "")[:200], "version": str(version or "")[:100]},
            **process()}


def anthropic_model(model: str) -> dict[str, Any]:
    """An agent through our Anthropic tool-use loop (``orchestrator agent``): the model it asks."""
    return {"kind": AGENT, "via": "anthropic", "model": str(model)[:200], **process()}


def in_process_agent() -> dict[str, Any]:
    """Tool calls made in this process with no transport that names a client."""
    return {"kind": AGENT, "via": "tools", **process()}


def default_for(actor: str) -> dict[str, Any] | None:
    """The record for ``actor`` when the caller set none; None for the engine's own events."""
    if actor == "human":
        return person()
    if actor == "agent":
        return in_process_agent()
    return None


def label(who: dict[str, Any] | None, actor: str = "") -> str:
    """One short name for a record, as show and audit print it."""
    if not isinstance(who, dict):
        return f"{actor or '?'} (no one recorded)"
    where = f"{who.get('user', '?')}@{who.get('host', '?')}"
    if who.get("kind") == PERSON:
        return f"person {where}" + (f" as {who['as']}" if who.get("as") else "")
    via = who.get("via")
    if via == "mcp":
        client = who.get("client") or {}
        return f"agent MCP client {client.get('name') or '?'} {client.get('version') or '?'}".rstrip()
    if via == "anthropic":
        return f"agent {who.get('model', '?')} (our Anthropic loop)"
    return f"agent (in-process tool calls, no client named; {where})"


def process_label(who: dict[str, Any] | None) -> str:
    """How the act's process ran: a terminal or not, and what started it."""
    if not isinstance(who, dict):
        return ""
    tty = "tty" if who.get("tty") else "no tty"
    return f"{tty}; parent: {who.get('parent') or '?'}"


def actors(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per distinct person or agent: its label, kind and the seqs of its acts."""
    rows: dict[str, dict[str, Any]] = {}
    last: tuple[Any, Any, dict[str, Any] | None] = (None, None, None)
    for event in events:
        actor = event.get("actor")
        if actor == "engine":
            continue
        who = event.get("who")
        if (actor, who) != last[:2]:  # one writer's acts come in runs: label each run once
            name = label(who, str(actor))
            row = rows.setdefault(name, {"label": name, "kind": who.get("kind") if isinstance(who, dict) else None,
                                         "actor": actor, "seqs": []})
            last = (actor, who, row)
        last[2]["seqs"].append(event.get("seq"))
    return list(rows.values())


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream is not None and stream.isatty())
    except (ValueError, OSError):
        return False


def _command() -> str:
    """This process's command line, ``orchestrator ...`` for the CLI however it was started."""
    argv = list(sys.argv)
    cli = os.path.join("orchestrator", "cli.py")
    if argv and (os.path.basename(argv[0]) == "orchestrator" or argv[0].endswith(cli)):
        argv[0] = "orchestrator"
    return _clip(" ".join(argv))


def _parent_command() -> str | None:
    """The parent process's command line (Linux /proc); None where it cannot be read."""
    from pathlib import Path

    try:
        raw = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    except OSError:
        return None
    return _clip(raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")) or None


def _clip(text: str) -> str:
    return text if len(text) <= MAX_COMMAND else text[:MAX_COMMAND - 3] + "..."
