"""Our own agent: a plain Anthropic tool-use loop over ``messages.create`` driving one run.

Each turn re-renders the system prompt from the run's snapshot (the phase, its
``agent_notes`` and ``allowed_paths``, the issues, the pending questions), so the rules the
model reads always belong to the phase the run is in. Tool calls go through
``tools.call_tool``, the same dispatcher the MCP server uses, which records one
``AgentActed`` event per call. The loop stops when the run is done, waits for a human,
the model stops calling tools, or the turn limit is hit. The whole transcript (system
prompts, messages, tool calls and results) is stored as an artifact of the run, written
even when the API fails. The client is passed in, so tests swap only the transport (a
scripted model) and the real loop runs unchanged. The API key lives in the client only.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Literal

from orchestrator.agent.tools import TOOLS, call_tool
from orchestrator.errors import EXIT_FAILED, OrchestratorError, RunBusy, UsageError

DEFAULT_MODEL = "claude-sonnet-5-5"
StopReason = Literal["done", "aborted", "human", "job", "model_stopped", "turn_limit"]


class AgentApiError(OrchestratorError):
    """The Anthropic API refused or failed a request; the transcript so far is stored."""

    code = "agent_api_error"
    exit_code = EXIT_FAILED


@dataclass(frozen=True, kw_only=True)
class DriveResult:
    """How a drive ended.

    Attributes:
        stop_reason: done | aborted | human | job (a cluster job runs) | model_stopped | turn_limit.
        turns: messages.create calls made, e.g. 4.
        tool_calls: tool calls executed (each one an AgentActed event).
        transcript: artifact name of the stored transcript, e.g. "agent/transcript-...json".
        state: the run's snapshot afterwards; exit_code: the CLI code it maps to.
    """

    run_id: str
    stop_reason: StopReason
    turns: int
    tool_calls: int
    transcript: str
    state: dict[str, Any]
    exit_code: int


def build_client(*, api_key: str | None = None) -> Any:
    """An ``anthropic.Anthropic`` client from ``ANTHROPIC_API_KEY``; UsageError (exit 2) without one."""
    key = api_key or os.environ.get("ANTHROPIC_API_KEY", "").strip()
    if not key:
        raise UsageError("ANTHROPIC_API_KEY is not set; export your Anthropic API key to run `orchestrator agent`")
    import anthropic

    return anthropic.Anthropic(api_key=key)


def tool_definitions() -> list[dict[str, Any]]:
    """The tool table in the Messages API's shape."""
    return [{"name": s.name, "description": s.description, "input_schema": s.input_schema()} for s in TOOLS.values()]


def render_system_prompt(state: dict[str, Any], offers: list[dict[str, Any]] | None = None) -> str:
    """agent_system.md.j2 for the run's current phase (StrictUndefined); ``offers``: ``fix_index.offer_views``."""
    from orchestrator.context import render_template
    from orchestrator.workflow import load_workflow

    workflow = load_workflow(state["workflow"])
    spec = next((p for p in workflow.phases if p.name == state["phase"]), None)
    return render_template("agent", "agent_system.md.j2", workflow=workflow, run=state,
                           phase_title=spec.title if spec else "",
                           allowed_paths=list(spec.allowed_paths) if spec else [],
                           agent_notes=spec.agent_notes if spec else "", tool_names=list(TOOLS),
                           offers=offers or [])


def drive(run_id: str, *, store: Any, client: Any, model: str = DEFAULT_MODEL, max_turns: int = 30,
          max_tokens: int = 8192, progress: Callable[[str], None] = lambda _m: None) -> DriveResult:
    """Loop model turns and tool calls until the run is done, waits for a human, or turns run out."""
    if max_turns < 1:
        raise UsageError(f"--max-turns must be at least 1 (got {max_turns})")
    from orchestrator.trail.identity import anthropic_model

    store = store.acting(agent=anthropic_model(model))
    state = store.read_state(run_id)
    messages: list[dict[str, Any]] = [{"role": "user", "content": _kickoff(state)}]
    log: dict[str, Any] = {"run_id": run_id, "model": model, "max_turns": max_turns, "systems": [], "turns": []}
    turns = calls = 0
    stop: StopReason | None = None
    try:
        while True:
            state = store.read_state(run_id)
            stop = _stop_reason(state) or ("turn_limit" if turns >= max_turns else None)
            if stop:
                break
            system = render_system_prompt(state, _offers(store, state))
            if not log["systems"] or log["systems"][-1]["text"] != system:
                log["systems"].append({"from_turn": turns + 1, "text": system})
            response = _create(client, model=model, system=system, messages=messages, max_tokens=max_tokens)
            turns += 1
            content = [_block_param(b) for b in response.content]
            messages.append({"role": "assistant", "content": content})
            uses = [b for b in content if b["type"] == "tool_use"]
            log["turns"].append({"turn": turns, "stop_reason": response.stop_reason, "usage": _usage(response),
                                 "tools": [u["name"] for u in uses]})
            progress(f"turn {turns}: " + (", ".join(u["name"] for u in uses) or "no tool call"))
            if not uses:
                stop = "model_stopped"
                break
            messages.append({"role": "user", "content": [_run_tool(u, store=store, progress=progress) for u in uses]})
            calls += len(uses)
    finally:
        log.update(messages=messages, stop_reason=stop, turns_used=turns, tool_calls=calls)
        transcript = save_transcript(store, run_id, log, secret=getattr(client, "api_key", None))
    from orchestrator.engine import exit_code_for

    final = store.read_state(run_id)
    return DriveResult(run_id=run_id, stop_reason=stop or "turn_limit", turns=turns, tool_calls=calls,
                       transcript=transcript, state=final, exit_code=exit_code_for(final))


def save_transcript(store: Any, run_id: str, log: dict[str, Any], *, secret: str | None) -> str:
    """Write the transcript as artifacts/agent/transcript-<time>.json (actor agent); returns its name."""
    from orchestrator.trail import events as ev
    from orchestrator.trail.writer import utc_now

    text = json.dumps(log, indent=1, sort_keys=True, default=str)
    if secret:
        text = text.replace(secret, "[redacted]")
    stamp = utc_now().replace(":", "").replace("-", "").replace("+0000", "Z").replace(".", "-")
    for _attempt in range(100):
        try:
            with store.open_run(run_id) as run:
                name, sha, size = run.write_artifact_file(f"agent/transcript-{stamp}.json", text)
                run.append(ev.ArtifactWritten(name=name, sha256=sha, bytes=size), actor="agent",
                           phase=run.state["phase"] or None)
                return name
        except RunBusy:
            time.sleep(0.1)
    raise RunBusy(f"run {run_id} stayed busy; the agent transcript could not be stored")


def _offers(store: Any, state: dict[str, Any]) -> list[dict[str, Any]]:
    """The proven fixes offered for the run's open findings (none while it has none)."""
    from orchestrator.fix_index import offer_views

    if not state["issues"]:
        return []
    return offer_views(store.runs_dir, state, store.read_events(state["run_id"]))


def _kickoff(state: dict[str, Any]) -> str:
    return (f"Drive run {state['run_id']} ({state['workflow']}). It is in phase {state['phase']}. "
            "Call explain, fix what the phase needs inside the allowed paths, and call advance until the run "
            "is done or waits for a human.")


def _stop_reason(state: dict[str, Any]) -> StopReason | None:
    if state["status"] == "done":
        return "done"
    if state["status"] == "aborted":
        return "aborted"
    if state["awaiting"] in ("human", "job"):  # a cluster job: nothing for the agent until it ends
        return state["awaiting"]
    return None


def _create(client: Any, **request: Any) -> Any:
    import anthropic

    try:
        return client.messages.create(tools=tool_definitions(), **request)
    except anthropic.APIStatusError as exc:
        raise AgentApiError(f"Anthropic API error {exc.status_code}: {_one_line(exc.message)}") from None
    except anthropic.APIError as exc:
        raise AgentApiError(f"Anthropic API error: {_one_line(str(exc))}") from None


def _run_tool(use: dict[str, Any], *, store: Any, progress: Callable[[str], None]) -> dict[str, Any]:
    arguments = use["input"] if isinstance(use["input"], dict) else {}
    result = call_tool(use["name"], arguments, store=store, call_id=use["id"], progress=progress)
    blocks = result.blocks()
    content: Any = blocks[0] if len(blocks) == 1 else [{"type": "text", "text": b} for b in blocks if b]
    return {"type": "tool_result", "tool_use_id": use["id"], "content": content,
            "is_error": result.is_error}


def _block_param(block: Any) -> dict[str, Any]:
    """A response block as the request param the next turn sends back."""
    if block.type == "text":
        return {"type": "text", "text": block.text}
    if block.type == "tool_use":
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    return block.model_dump(mode="json", exclude_none=True)


def _usage(response: Any) -> dict[str, Any]:
    usage = getattr(response, "usage", None)
    return usage.model_dump(mode="json", exclude_none=True) if usage is not None else {}


def _one_line(text: str) -> str:
    return " ".join(str(text).split())[:300]
