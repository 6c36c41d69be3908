"""The agent's file tools: read, write, edit and diff inside the run's target, commit_branch, apply_fix.

Each handler takes its argument model and the call's ``ToolEnv`` and returns a ``ToolResult``;
``tools.TOOLS`` lists them beside the run tools, and ``tools.call_tool`` records every call. The
scope checks live in ``files`` (paths) and ``commit`` (branches); a refusal raises there and the
dispatcher turns it into a refused result that leads with ``NOT_DONE``'s words. Every tool that
writes records its edit whole (``edits.tool_edit``, under the run's lock the call holds): what
changed outside the tools since the last record first, then the call's own change.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from orchestrator.agent import files
from orchestrator.agent.tool_args import (
    ApplyDiffArgs, ApplyFixArgs, CommitBranchArgs, EditFileArgs, ReadFileArgs, ToolResult, WriteFileArgs,
)
from orchestrator.agent.views import live_state, scope_for

NOT_DONE = {"write_file": "file NOT written", "edit_file": "edit NOT made", "apply_diff": "diff NOT applied",
            "commit_branch": "NOT committed", "apply_fix": "fix NOT applied"}
"""How a refusal of a tool that writes the target starts, so that it never reads like a result."""


def read_file(args: ReadFileArgs, env: Any) -> ToolResult:
    scope = scope_for(env.store.read_state(args.run_id))
    data = files.read_text(scope, args.path, offset=args.offset, max_chars=args.max_chars)
    text = data.pop("text", None)
    return ToolResult(status="ok", message=f"{data['kind']} {data['path']}", data=data, text=text)


def next_step(state: dict[str, Any]) -> str:
    """What to call once the edits are complete: the phase's branch submission where it takes one, else advance."""
    from orchestrator.agent.commit import branch_kinds
    from orchestrator.workflow import load_workflow

    kinds = branch_kinds(load_workflow(state["workflow"]), state["phase"])
    return f"then commit_branch and submit kind={kinds[0]!r}" if kinds else "call advance"


@contextlib.contextmanager
def recorded_edit(env: Any, run_id: str, tool: str) -> Iterator[Any]:
    """The run (held by the calling tool) with the call's edit recorded whole around the block."""
    from orchestrator.edits import tool_edit

    with env.store.open_run(run_id) as run, tool_edit(run, tool=tool, call_id=env.call_id):
        yield run


def write_file(args: WriteFileArgs, env: Any) -> ToolResult:
    state = live_state(env.store, args.run_id)
    with recorded_edit(env, args.run_id, "write_file"):
        data = files.write_text(scope_for(state), args.path, args.content)
    return ToolResult(status="ok", message=f"wrote {data['path']}; {next_step(state)} when the fix is complete",
                      data=data)


def edit_file(args: EditFileArgs, env: Any) -> ToolResult:
    scope = scope_for(live_state(env.store, args.run_id))
    with recorded_edit(env, args.run_id, "edit_file"):
        data = files.replace_once(scope, args.path, args.old_string, args.new_string)
    return ToolResult(status="ok", message=f"edited {data['path']} at line {data['line']}", data=data)


def commit_branch(args: CommitBranchArgs, env: Any) -> ToolResult:
    from orchestrator.agent.commit import branch_kinds, commit_edits
    from orchestrator.workflow import load_workflow

    state = live_state(env.store, args.run_id)
    kinds = branch_kinds(load_workflow(state["workflow"]), state["phase"])
    if not kinds:
        return ToolResult(status="refused", message=f"phase {state['phase']} takes no branch; leave your edits in the "
                          "checkout and call advance (the engine checks them, a person decides any commit)")
    with recorded_edit(env, args.run_id, "commit_branch"):
        data = commit_edits(scope_for(state), branch=args.branch, message=args.message)
    return ToolResult(status="ok", data=data, message=(
        f"committed {len(data['files'])} file(s) to new branch {args.branch} ({data['commit'][:10]}); the checkout "
        f"is back at HEAD; next: submit kind={kinds[0]!r} with args {{\"branch\": \"{args.branch}\", ...}}"))


def apply_diff(args: ApplyDiffArgs, env: Any) -> ToolResult:
    state = live_state(env.store, args.run_id)
    with recorded_edit(env, args.run_id, "apply_diff"):
        data = files.apply_unified_diff(scope_for(state), args.diff)
    return ToolResult(status="ok", message=f"applied to {', '.join(data['paths'])}; {next_step(state)} when done",
                      data=data)


def apply_fix(args: ApplyFixArgs, env: Any) -> ToolResult:
    """Apply an offered proven fix (``fix_index``): the whole diff, under apply_diff's scope rules."""
    from orchestrator.fix_index import offered_diff

    state = live_state(env.store, args.run_id)
    with recorded_edit(env, args.run_id, "apply_fix") as run:
        diff, offer = offered_diff(run, args.offer)
        try:
            data = files.apply_unified_diff(scope_for(state), diff)
        except files.ScopeRefused as exc:
            if not exc.message.startswith("the diff does not apply"):
                raise
            raise files.ScopeRefused(f"offer {args.offer} does not apply cleanly here ({exc.message}); its diff is "
                                     f"artifact {offer['diff']}: read it with read_artifact and make the edit by "
                                     "hand, or ignore the offer") from None
    proven = ", ".join(p["run_id"] for p in offer["proofs"])
    return ToolResult(status="ok", data={**data, "offer": args.offer, "diff": offer["diff"], "proven_by": proven},
                      message=f"applied offer {args.offer} (proven by {proven}) to {', '.join(data['paths'])}; "
                              f"{next_step(state)} to check it")
