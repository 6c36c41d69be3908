"""The temporary-patch ledger: core edits that must be measured, then reverted with proof.

A patch enters only as the ``patch`` submission row (``engine.submit``: CLI ``orchestrator
submit RUN patch`` or ``orchestrator patch``, agent tool ``submit``), whose check (the
workflow's) takes it with ``accept_patch``, or by ``apply_in_context`` (a phase's built-in
recipe); both then measure and record the row the same way, in the workflow's code. The
ledger checks the diff applies, refuses paths inside the
workflow's permanent scope (those are normal edits), takes the workspace's patch lock, records
every touched file's blob id before and after, applies with ``git apply``, and immediately runs
the workflow's measurement so that no row exists without a run behind it. ``revert_all``
restores each file to the base and proves it by comparing blob ids with the base commit.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from orchestrator.errors import RuleBroken, UsageError
from orchestrator.git import base_blob_hash, blob_hash, diff_paths, git_apply, open_repo
from orchestrator.workflow import PATCH, Submission

LOCK_NAME = "orchestrator-patch-holder.json"


def apply_in_context(ctx: Any, *, diff: str, label: str, scope: tuple[str, ...]) -> dict[str, Any]:
    """Apply one temporary patch in the current phase, record it, measure it. Returns the event data."""
    target = Path(ctx.target)
    paths = diff_paths(target, diff)
    inside = [p for p in paths if p.startswith(scope)]
    if inside:
        raise UsageError(f"patch {label!r} touches {', '.join(inside)}, inside the permanent scope "
                         f"({', '.join(scope)}): that is a normal edit, not a temporary patch; edit the files directly")
    hold_workspace(target, ctx.run_id)
    before = {p: blob_hash(target, p) for p in paths}
    git_apply(target, diff)
    patch_id = f"patch-{ctx.state['last_seq'] + 1}-{secrets.token_hex(2)}"
    name = ctx.write_artifact(f"patches/{patch_id}.diff", diff)
    files = {p: {"before": before[p], "after": blob_hash(target, p)} for p in paths}
    ctx.record("patch_applied", patch_id=patch_id, label=label, diff=name, files=files)
    return {"patch_id": patch_id, "label": label, "files": files}


def revert_if_waived(ctx: Any, code: str) -> dict[str, str | None] | None:
    """The revert proof when a person waived ``code`` of this phase (the waiver passes it: no temporary
    patch may outlive the phase, as when its gap is explained); None while ``code`` is not waived."""
    from orchestrator.waivers import waived_codes

    return revert_all(ctx) if code in waived_codes(ctx.state, ctx.phase) else None


def revert_all(ctx: Any) -> dict[str, str | None]:
    """Restore every file of every open patch to the base commit and prove it (blob ids)."""
    target, base = Path(ctx.target), ctx.base["commit"]
    open_patches = dict(ctx.state["open_patches"])
    if not open_patches:
        release_workspace(target, ctx.run_id)
        return {}
    paths = sorted({p for patch in open_patches.values() for p in patch["files"]})
    repo = open_repo(target)
    for path in paths:
        if base_blob_hash(target, base, path) is None:
            (target / path).unlink(missing_ok=True)
        else:
            repo.git.checkout(base, "--", path)
            repo.git.reset("-q", "--", path)
    after = {p: blob_hash(target, p) for p in paths}
    wrong = [p for p in paths if after[p] != base_blob_hash(target, base, p)]
    if wrong:
        raise RuleBroken(f"revert left {', '.join(wrong)} different from the base commit {base[:10]}; "
                         "restore them by hand (git checkout BASE -- PATH) and advance again")
    ctx.record("patch_reverted", patch_ids=sorted(open_patches), files=after)
    release_workspace(target, ctx.run_id)
    return after


def hold_workspace(target: Path, run_id: str) -> None:
    """Mark the workspace as holding this run's temporary patches; refuse another run's."""
    holder = _holder_path(target)
    if holder.is_file():
        owner = json.loads(holder.read_text()).get("run_id")
        if owner != run_id:
            raise UsageError(f"workspace {target} holds temporary patches of run {owner}; "
                             f"revert them there (`orchestrator revert-patches {owner}`) before patching from {run_id}")
        return
    holder.write_text(json.dumps({"run_id": run_id}))


def release_workspace(target: Path, run_id: str) -> None:
    holder = _holder_path(target)
    if holder.is_file() and json.loads(holder.read_text()).get("run_id") == run_id:
        holder.unlink()


def _holder_path(target: Path) -> Path:
    return Path(open_repo(target).git_dir) / LOCK_NAME


class PatchArgs(BaseModel):
    """A temporary patch of the gap-analysis ledger: the engine applies it, records the blob hashes,
    measures it, and requires it reverted before the run may finish."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
    diff: str
    """Unified diff relative to the target's root."""
    label: str
    """Short label saying what the patch tests (names its row in the table), e.g. "skip grouped_mm"."""


class PatchRefused(BaseModel):
    """A ``patch_refused`` record: a submitted patch the engine did not apply, and why."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    label: str
    reason: str
    """The refusal's message (outside the workflow's scope, does not apply, ...)."""
    tool_call_id: str | None = None
    """The agent's tool call that submitted it (None from the CLI)."""


def patch_row(phase: str, *, check: str) -> Submission:
    """The workflow's one declaration of temporary patches: its ``patch`` submission row.

    Args:
        phase: the only phase in which the ledger takes patches.
        check: "module:function" called as ``fn(ctx, args, tool_call_id)``: takes the patch with
            ``accept_patch``, then measures it and records its row as the phase's recipes do.
    """
    return Submission(phase=phase, args=PatchArgs, check=check, drive=False, noun="temporary patches")


def accept_patch(ctx: Any, args: PatchArgs, tool_call_id: str | None) -> dict[str, Any]:
    """Apply and record a submitted patch (``apply_in_context``'s data); a refusal is recorded, then raised."""
    from orchestrator.workflow import load_workflow

    if not args.label.strip():
        raise UsageError("a patch needs --label TEXT (it names the row in the table)")
    try:
        return apply_in_context(ctx, diff=args.diff, label=args.label,
                                scope=load_workflow(ctx.state["workflow"]).scope)
    except UsageError as exc:
        ctx.add_record("patch_refused", PatchRefused(label=args.label, reason=exc.message, tool_call_id=tool_call_id))
        raise


def revert_patches(run_id: str, *, store: Any, actor: str = "human", tool_call_id: str | None = None) -> Any:
    """Revert every open patch of the run, in the phase its ``patch`` row names (the same check as submitting)."""
    from orchestrator.engine import Outcome, refuse_terminal, submission_context
    from orchestrator.trail.snapshot import exit_code_for
    from orchestrator.workflow import load_workflow

    with store.open_run(run_id) as run:
        refuse_terminal(run.state)
        ctx, _ = submission_context(run, load_workflow(run.state["workflow"]), PATCH, actor=actor)
        labels = {pid: p.get("label", pid) for pid, p in run.state["open_patches"].items()}
        proof = revert_all(ctx)
        named = ", ".join(f"{pid} ({label})" for pid, label in labels.items())
        said = (f"reverted {len(labels)} temporary patch(es): {named}; {len(proof)} file(s) back at the base commit"
                if labels else "no temporary patch was applied")
        return Outcome(run_id=run_id, state=run.state, exit_code=exit_code_for(run.state), messages=(said,))


