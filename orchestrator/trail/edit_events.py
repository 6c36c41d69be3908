"""Events of the edits a run records whole and of the fixes they prove (``orchestrator/edits.py``, ``fixes.py``,
``fix_index.py``): part of the one union in ``events.py``, kept apart so that module stays readable."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from orchestrator.trail.event_body import EventBody as _Data


class EditRecorded(_Data):
    type: Literal["edit_recorded"] = "edit_recorded"
    by: Literal["tool", "phase", "outside"]
    """Who changed the tracked paths: "tool", an agent's file tool call (``tool``, ``call_id``); "phase", the
    event's phase while it ran (its own writes); "outside", someone outside the engine's tools (a person, an
    agent's own file tools, a command killed before it recorded), seen when the next command began."""
    tool: str | None = None
    """The agent tool that made the edit (write_file, edit_file, apply_diff, apply_fix, commit_branch)."""
    call_id: str | None = None
    """That tool call's id (its ``agent_acted`` event carries the same)."""
    paths: list[str]
    """The tracked path prefixes: the workflow's scope and every phase's allowed paths."""
    files: dict[str, dict[str, str | None]]
    """Path -> {"before": git blob id or None (no such file), "after": ...}, for every file that changed."""
    diff: str
    """Artifact name of the whole diff from ``tree_before`` to ``tree_after`` (``git diff --binary --full-index``)."""
    tree_before: str
    """Git tree id of the workspace as last recorded: the base commit's tree, the tracked paths as they were."""
    tree_after: str
    """The same after this edit."""
    base_tree: str
    """Git tree id of the base commit: the target's content at start, the same for every run on that content."""


class FindingRef(_Data):
    code: str
    subject: str
    """The finding's message with the run's target path, numbers and hex ids masked (``fixes.finding_subject``):
    what it names, e.g. "...maps gate.e_score_correction_bias to model.layers.N.mlp.expert_bias..."."""


class ClearedFinding(FindingRef):
    message: str
    raised_seq: int
    """Seq of the first ``phase_completed`` of the phase's unbroken run of completions that raised it."""


class FindingsCleared(_Data):
    type: Literal["findings_cleared"] = "findings_cleared"
    completed_seq: int
    """Seq of the ``phase_completed`` that no longer raises them."""
    cleared: list[ClearedFinding]
    edits: list[int]
    """Seqs of the ``edit_recorded`` events (by a tool or from outside) between ``raised_seq`` and ``completed_seq``."""
    files: dict[str, dict[str, str | None]]
    """Path -> {"before", "after"} blob ids of the combined diff."""
    diff: str
    """Artifact name of those edits' combined diff (every file they touched, whatever else it fixed)."""
    base_tree: str
    still_open: list[str]
    """Codes the completion still raises."""


class FixProof(_Data):
    run_id: str
    phase: str
    raised_seq: int
    edit_seqs: list[int]
    completed_seq: int
    """The completion without the finding."""
    cleared_seq: int
    """The proving run's ``findings_cleared`` event."""
    passed_seq: int
    """The ``transition_taken`` by which that run left the phase."""
    by: list[str]
    """Who made the edits: tool names, "outside"."""


class FixOffered(_Data):
    type: Literal["fix_offered"] = "fix_offered"
    offer: str
    """Offer id, "fix-" + the first 12 hex of the diff's sha256 (``apply_fix`` takes it)."""
    findings: list[FindingRef]
    """The findings of this run it is offered for."""
    diff: str
    """Artifact name of this run's copy of the proving diff."""
    diff_sha256: str
    files: list[str]
    proofs: list[FixProof]
    cleared_with: list[str] = Field(default_factory=list)
    """Other codes the same diff cleared in the proving runs (the whole diff is offered)."""
    applies: bool
    """``git apply --check`` of the diff on this run's target when offered."""
    apply_check: str = ""
    """Git's reason when it does not apply."""
