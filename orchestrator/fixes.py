"""Proven fixes: what a run's own trail shows an edit cleared, and the offers made from it to later runs.

When a phase completes, the engine compares its findings with those of the phase's previous
completion. A finding that is gone, with edits recorded since it was first raised (by an agent's
tools or from outside them; a phase's own writes do not count), is recorded as
``findings_cleared``: which findings, the seqs of the edits, and their combined diff as an
artifact (every file they touched: an edit that fixed several things is offered whole). Such a
clearing proves a fix once the run has left the phase (``fix_index``). When a completion raises a
finding that a proven fix cleared elsewhere on the same target, ``fix_offered`` records the offer
with a copy of the diff; the agent applies it with the ``apply_fix`` tool, or ignores it.

Same finding: the same code and subject (``finding_subject``: the message with the run's target path,
numbers and hex ids masked, so a layer index or a workspace path does not make two findings differ,
while the names a message gives, which differ per model where the fix does, still count). Same
target: the same tree at the base commit (content, not commit id: every workspace made from one
torchtitan has it).
"""

from __future__ import annotations

import re
from typing import Any

HEX = re.compile(r"\b(?=[0-9a-f]*[a-f])[0-9a-f]{7,64}\b")
NUMBER = re.compile(r"\b\d+(?:\.\d+)?(?:e[-+]?\d+)?\b")
"""A number standing alone (a layer index, a count, a KL), never a digit inside a name such as Qwen3MoeBlock."""


def finding_subject(message: str, *, target: str) -> str:
    """What a finding names, comparable across runs and models: the message with paths, ids and numbers masked."""
    root = target.rstrip("/")
    text = message.replace(root + "/", "").replace(root, "<target>") if root else message
    return " ".join(NUMBER.sub("N", HEX.sub("<hex>", text)).split())


def finding_ref(issue: dict[str, Any], *, target: str) -> tuple[str, str]:
    """(code, subject) of a recorded issue."""
    return issue["code"], finding_subject(issue["message"], target=target)


def record_cleared(run: Any, events: list[dict[str, Any]], *, phase: str) -> None:
    """Record the findings the last completion of ``phase`` no longer raises that edits since their raise cleared."""
    completions = [e for e in events if e["type"] == "phase_completed" and e["phase"] == phase]
    if len(completions) < 2:
        return
    target = run.state["target"]
    current, previous = completions[-1], completions[-2]
    still = {finding_ref(i, target=target) for i in current["data"]["issues"]}
    waived = set((current["data"].get("data") or {}).get("waived") or {})  # gone by a person's word, not an edit
    by_start: dict[int, list[dict[str, Any]]] = {}
    for issue in previous["data"]["issues"]:
        ref = finding_ref(issue, target=target)
        if ref not in still and ref[0] not in waived:
            start = _raised_at(completions[:-1], ref, target=target)
            by_start.setdefault(start, []).append({"code": ref[0], "subject": ref[1], "message": issue["message"],
                                                   "raised_seq": start})
    for start, cleared in sorted(by_start.items()):
        edits = [e for e in events if e["type"] == "edit_recorded" and e["data"]["by"] != "phase"
                 and start < e["seq"] < current["seq"]]
        if edits:
            _record_one_clearing(run, edits, cleared=cleared, completed=current)


def _raised_at(completions: list[dict[str, Any]], ref: tuple[str, str], *, target: str) -> int:
    """Seq of the first completion of the unbroken run of completions (ending with the last) raising ``ref``."""
    start = completions[-1]["seq"]
    for completion in reversed(completions):
        if ref not in {finding_ref(i, target=target) for i in completion["data"]["issues"]}:
            break
        start = completion["seq"]
    return start


def _record_one_clearing(run: Any, edits: list[dict[str, Any]], *, cleared: list[dict[str, Any]],
                         completed: dict[str, Any]) -> None:
    from orchestrator.edits import changed_files, tree_diff
    from orchestrator.trail import events as ev

    target = run.state["target"]
    touched = sorted({path for e in edits for path in e["data"]["files"]})
    first, last = edits[0]["data"]["tree_before"], edits[-1]["data"]["tree_after"]
    diff = tree_diff(target, first, last, touched)
    if not diff.strip():  # the edits undid one another: nothing to offer
        return
    seq = run.state["last_seq"] + 1
    name, sha, size = run.write_artifact_file(f"fixes/cleared-{seq:06d}.diff", diff)
    record = ev.FindingsCleared(
        completed_seq=completed["seq"], cleared=[ev.ClearedFinding(**c) for c in cleared],
        edits=[e["seq"] for e in edits], files=changed_files(target, first, last, touched), diff=name,
        base_tree=edits[0]["data"]["base_tree"], still_open=[i["code"] for i in completed["data"]["issues"]])
    run.append_many([ev.ArtifactWritten(name=name, sha256=sha, bytes=size), record], phase=completed["phase"])
