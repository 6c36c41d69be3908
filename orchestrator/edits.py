"""Every change to a run's tracked paths, recorded whole: who made it, each file's blobs, the diff.

The engine sees the workspace as git does: the base commit's tree with the tracked paths (the
workflow's scope and every phase's allowed paths) taken from the working tree, written as a tree
object through a private index (``git add -A`` of those paths; files git ignores are neither checked
nor recorded, as for the scope guard). Whenever that tree differs from the last one the trail
records, an ``edit_recorded`` event says who changed what: an agent's file tool call ("tool"), a
phase while it ran ("phase"), or someone outside the engine's tools, seen when the next command
began ("outside"); with each file's blob id before and after and the whole diff as an artifact. The
diffs chain from the base commit, so applied in order they rebuild the tracked paths at any seq
(state/README.md). ``refs/orchestrator/edits/<run_id>`` keeps the last recorded tree from git's gc.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterator, Literal

from orchestrator.errors import UsageError

By = Literal["tool", "phase", "outside"]
EMPTY_BLOB = "0" * 40


def tracked_paths(workflow: Any) -> tuple[str, ...]:
    """The path prefixes whose every change is recorded: the workflow's scope and its phases' allowed paths."""
    return tuple(sorted(set(workflow.scope) | {p for spec in workflow.phases for p in spec.allowed_paths}))


def git_out(target: str | Path, *args: str, index: str | None = None) -> bytes:
    """``git -C target args`` (with a private index when given); UsageError naming git's reason.

    Pathspecs are literal (``GIT_LITERAL_PATHSPECS``): a file named ``a*`` is that file, a prefix its folder.
    """
    env = {**os.environ, "GIT_LITERAL_PATHSPECS": "1", **({"GIT_INDEX_FILE": index} if index else {})}
    proc = subprocess.run(["git", "-C", str(target), *args], capture_output=True, env=env, timeout=120)
    if proc.returncode != 0:
        reason = (proc.stderr.decode("utf-8", "replace").strip().splitlines() or ["failed"])[0]
        raise UsageError(f"git {args[0]} in {target}: {reason}")
    return proc.stdout


def base_tree(target: str | Path, base_commit: str) -> str:
    """The tree id of the base commit (content-addressed: equal for every checkout of the same content)."""
    return git_out(target, "rev-parse", f"{base_commit}^{{tree}}").decode().strip()


def workspace_tree(target: str | Path, *, base_commit: str, paths: tuple[str, ...]) -> str:
    """The tree id of the base commit with ``paths`` as the working tree has them now."""
    with tempfile.TemporaryDirectory(prefix="orchestrator-edits-") as tmp:
        index = os.path.join(tmp, "index")
        git_out(target, "read-tree", base_commit, index=index)
        present = [p for p in paths if Path(target, p).exists()]
        gone = [p for p in paths if p not in present]
        if gone:  # a path git add may name only while the base has files under it (their deletion)
            in_base = set(git_out(target, "ls-files", "-z", "--", *gone, index=index).split(b"\0")) - {b""}
            present += [p for p in gone if _any_under(in_base, p)]
        if present:
            git_out(target, "add", "-A", "--", *present, index=index)
        return git_out(target, "write-tree", index=index).decode().strip()


def _any_under(files: set[bytes], prefix: str) -> bool:
    stem = prefix.rstrip("/").encode()
    return not stem or stem == b"." or any(f == stem or f.startswith(stem + b"/") for f in files)


def changed_files(target: str | Path, before: str, after: str, paths: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Path -> {"before", "after"} blob ids (None where the file is absent) between two trees."""
    raw = git_out(target, "diff-tree", "-r", "-z", "--no-renames", before, after, "--", *paths).split(b"\0")
    files: dict[str, dict[str, Any]] = {}
    for meta, path in zip(raw[0::2], raw[1::2]):
        fields = meta.decode().split()
        if len(fields) >= 4:
            old, new = fields[2], fields[3]
            files[path.decode("utf-8", "surrogateescape")] = {"before": None if old == EMPTY_BLOB else old,
                                                             "after": None if new == EMPTY_BLOB else new}
    return files


def tree_diff(target: str | Path, before: str, after: str, paths: tuple[str, ...] | list[str]) -> bytes:
    """The whole diff between two trees over ``paths``, as ``git apply`` takes it (binary files included)."""
    return git_out(target, "diff-tree", "-r", "-p", "--binary", "--full-index", "--no-renames", before, after,
                   "--", *paths)


def last_recorded_tree(events: list[dict[str, Any]]) -> str | None:
    """The workspace tree of the trail's last ``edit_recorded`` (None when nothing was recorded yet)."""
    for event in reversed(events):
        if event["type"] == "edit_recorded":
            return event["data"]["tree_after"]
    return None


def record_edits(run: Any, workflow: Any, *, by: By, tool: str | None = None, call_id: str | None = None,
                 actor: str = "engine") -> dict[str, Any] | None:
    """Record what changed in the tracked paths since the trail's last recorded state; None when nothing did."""
    paths, base = tracked_paths(workflow), (run.state.get("base") or {}).get("commit")
    if not paths or not base:
        return None
    target = run.state["target"]
    after, last = workspace_tree(target, base_commit=base, paths=paths), last_recorded_tree(run.read_events())
    base_id = base_tree(target, base) if after != last else ""
    before = last or base_id
    if after == before:
        return None
    from orchestrator.trail import events as ev

    seq = run.state["last_seq"] + 1
    name, sha, size = run.write_artifact_file(f"edits/{seq:06d}-{tool or by}.diff",
                                              tree_diff(target, before, after, paths))
    edit = ev.EditRecorded(by=by, tool=tool, call_id=call_id, paths=list(paths), diff=name, tree_before=before,
                           tree_after=after, base_tree=base_id, files=changed_files(target, before, after, paths))
    phase = run.state["phase"] or None
    recorded = run.append_many([ev.ArtifactWritten(name=name, sha256=sha, bytes=size), edit], actor=actor,
                               phase=phase)[-1]
    keep_reachable(target, run_id=run.run_id, tree=after)
    return recorded


def keep_reachable(target: str | Path, *, run_id: str, tree: str) -> None:
    """Point ``refs/orchestrator/edits/<run_id>`` at ``tree``, so git's gc keeps the last recorded state."""
    ref = f"refs/orchestrator/edits/{run_id}"
    try:
        git_out(target, "update-ref", ref, tree)
    except UsageError:
        # NOTE: only the run's own commands write its ref, under the run's lock (held now): a lock file
        # left on it is a killed command's, and every later record would fail on it.
        common = git_out(target, "rev-parse", "--git-common-dir").decode().strip()
        Path(target, common, f"{ref}.lock").unlink(missing_ok=True)
        git_out(target, "update-ref", ref, tree)


def record_outside(run: Any) -> Any:
    """Record what changed outside the tools since the last record (``abort``, before a tool's own edit)."""
    from orchestrator.workflow import load_workflow

    workflow = load_workflow(run.state["workflow"])
    record_edits(run, workflow, by="outside")
    return workflow


@contextlib.contextmanager
def tool_edit(run: Any, *, tool: str, call_id: str) -> Iterator[None]:
    """Around a file tool call: first what changed outside the tools since the last record, then the call's edit."""
    workflow = record_outside(run)
    try:
        yield
    finally:
        try:
            record_edits(run, workflow, by="tool", tool=tool, call_id=call_id, actor="agent")
        except UsageError as exc:  # the call may have acted: not a refusal, the engine failed (recorded as such)
            raise RuntimeError(f"{tool} ran, but its edit could not be recorded ({exc.message}); the next command "
                               "records what changed as made outside the tools") from exc


def edits_in(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each recorded edit of a trail, for ``show`` and ``audit``: who, when, which files changed and how.

    Returns dicts {seq, ts, actor, phase, by, tool, call_id, diff, files: [{path, change, before, after}]},
    ``change`` being "added", "deleted" or "modified".
    """
    rows = []
    for event in events:
        if event["type"] != "edit_recorded":
            continue
        data = event["data"]
        files = [{"path": path, "change": _change(blobs), **blobs} for path, blobs in sorted(data["files"].items())]
        rows.append({"seq": event["seq"], "ts": event["ts"], "actor": event["actor"], "phase": event["phase"],
                     "by": data["by"], "tool": data.get("tool"), "call_id": data.get("call_id"),
                     "diff": data["diff"], "files": files})
    return rows


def _change(blobs: dict[str, Any]) -> str:
    if blobs.get("before") is None:
        return "added"
    return "deleted" if blobs.get("after") is None else "modified"
