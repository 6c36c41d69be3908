"""The fixes a state dir knows, read from its trails, and the offers they make to a run's open findings.

A ``findings_cleared`` event (``orchestrator.fixes``) proves its diff once the same run has left the
phase (a later ``transition_taken`` from it). Only trails that verify count (chain and signatures,
``trail.inspector``), and only a diff whose bytes still match the sha256 its ``artifact_written``
recorded. Proofs of the same diff on the same base tree are one known fix, with every run that proves
it; its offer id is "fix-" + the diff's sha256[:12]. Nothing here is a list in the code: every state
dir learns from its own history.
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import UsageError
from orchestrator.fixes import finding_ref, record_cleared
from orchestrator.trail.trail_io import ARTIFACTS, EVENTS

MARK = b'"findings_cleared"'
SHOWN_DIFF_CHARS = 6000


@dataclass(frozen=True, kw_only=True)
class KnownFix:
    """One diff proven on one base tree: the findings it cleared and the runs that show it."""

    offer: str
    base_tree: str
    findings: tuple[tuple[str, str], ...]
    """(code, subject) pairs it cleared."""
    diff_sha256: str
    files: tuple[str, ...]
    proofs: tuple[dict[str, Any], ...]
    """``events.FixProof`` fields, one per proving clearing."""
    source: Path
    """The diff artifact of the first proof."""


def known_fixes(runs_dir: Path) -> tuple[list[KnownFix], list[dict[str, str]]]:
    """Every proven fix under ``runs_dir`` (most proofs first, each fix's proofs in the order they were cleared),
    and the trails passed over with why."""
    grouped: dict[tuple[str, str], list[tuple[str, dict[str, Any], dict[str, Any], Path]]] = {}
    skipped = []
    run_dirs = sorted(p for p in runs_dir.iterdir() if p.is_dir() and not p.name.startswith(".")) \
        if runs_dir.is_dir() else []
    for run_dir in run_dirs:
        proofs, why = _proofs_of(run_dir)
        if why:
            skipped.append({"run_id": run_dir.name, "reason": why})
        for proof, cleared, source, sha, cleared_at in proofs:
            grouped.setdefault((cleared["base_tree"], sha), []).append((cleared_at, proof, cleared, source))
    # run ids order runs by the second only: two started in one second sort by their random suffix
    fixes = [_known_fix(base, sha, [row[1:] for row in sorted(rows, key=lambda row: row[0])])
             for (base, sha), rows in grouped.items()]
    return sorted(fixes, key=lambda f: (-len(f.proofs), f.offer)), skipped


def _known_fix(base: str, sha: str, rows: list[tuple[dict[str, Any], dict[str, Any], Path]]) -> KnownFix:
    findings = {(c["code"], c["subject"]): None for _, cleared, _ in rows for c in cleared["cleared"]}
    files = sorted({path for _, cleared, _ in rows for path in cleared["files"]})
    return KnownFix(offer=f"fix-{sha[:12]}", base_tree=base, findings=tuple(findings), diff_sha256=sha,
                    files=tuple(files), proofs=tuple(p for p, _, _ in rows), source=rows[0][2])


def _proofs_of(run_dir: Path) -> tuple[list[tuple[dict[str, Any], dict[str, Any], Path, str, str]], str]:
    """(proof, findings_cleared data, diff file, diff sha256, when it was cleared) of each clearing the run proves;
    or why none count."""
    try:
        if MARK not in (run_dir / EVENTS).read_bytes():
            return [], ""
    except OSError as exc:
        return [], f"its events.jsonl cannot be read ({exc.strerror})"
    from orchestrator.trail.inspector import inspect_trail

    report = inspect_trail(run_dir)
    if report.blocking:
        return [], f"its trail does not verify: {report.blocking[0].message}"
    events = report.events[:report.keep]
    hashes = {e["data"]["name"]: e["data"]["sha256"] for e in events if e["type"] == "artifact_written"}
    found, why = [], ""
    for event in events:
        if event["type"] != "findings_cleared":
            continue
        passed = _left_phase(events, event)
        if passed is None:
            continue
        source = run_dir / ARTIFACTS / event["data"]["diff"]
        sha = _sha256(source)
        if sha is None or sha != hashes.get(event["data"]["diff"]):
            why = f"the diff {event['data']['diff']} of seq {event['seq']} is missing or differs from its sha256"
            continue
        found.append((_proof(run_dir.name, events, event, passed), event["data"], source, sha, event["ts"]))
    return found, why


def _left_phase(events: list[dict[str, Any]], cleared: dict[str, Any]) -> int | None:
    """Seq of the transition by which the run left the clearing's phase after it; None while it has not."""
    return next((e["seq"] for e in events if e["type"] == "transition_taken" and e["data"]["source"] == cleared["phase"]
                 and e["seq"] > cleared["data"]["completed_seq"]), None)


def _proof(run_id: str, events: list[dict[str, Any]], cleared: dict[str, Any], passed: int) -> dict[str, Any]:
    data, by_seq = cleared["data"], {e["seq"]: e for e in events}
    who = [by_seq[s]["data"].get("tool") or by_seq[s]["data"]["by"] for s in data["edits"] if s in by_seq]
    return {"run_id": run_id, "phase": cleared["phase"], "raised_seq": min(c["raised_seq"] for c in data["cleared"]),
            "edit_seqs": list(data["edits"]), "completed_seq": data["completed_seq"], "cleared_seq": cleared["seq"],
            "passed_seq": passed, "by": list(dict.fromkeys(who))}


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def offers_for(runs_dir: Path, state: dict[str, Any]) -> list[tuple[KnownFix, list[tuple[str, str]]]]:
    """The known fixes for the run's open findings on its base tree: (fix, the (code, subject) pairs it matches)."""
    if not state.get("issues") or not (state.get("base") or {}).get("commit"):
        return []
    from orchestrator.edits import base_tree

    target = state["target"]
    try:
        base = base_tree(target, state["base"]["commit"])
    except UsageError:  # the target is gone or not a checkout: nothing here can apply
        return []
    open_refs = {finding_ref(i, target=target) for i in state["issues"]}
    found = []
    for fix in known_fixes(runs_dir)[0]:
        matched = [ref for ref in fix.findings if ref in open_refs]
        if fix.base_tree == base and matched:
            found.append((fix, matched))
    return found


def after_completion(run: Any, *, phase: str) -> None:
    """After a completion of ``phase``: the findings edits cleared (``fixes``), then the offers for those still open."""
    events = run.read_events()
    record_cleared(run, events, phase=phase)
    if run.state["issues"]:
        record_offers(run, run.read_events())


def record_offers(run: Any, events: list[dict[str, Any]]) -> None:
    """Record ``fix_offered`` for each known fix of the run's open findings not offered in this run yet."""
    offered = {e["data"]["offer"] for e in events if e["type"] == "fix_offered"}
    for fix, matched in offers_for(run.dir.parent, run.state):
        if fix.offer not in offered:
            with contextlib.suppress(UsageError):  # its diff changed since it was read: no longer a proven fix
                record_offer(run, fix, matched)


def record_offer(run: Any, fix: KnownFix, matched: list[tuple[str, str]]) -> dict[str, Any]:
    """Copy the fix's diff into the run's artifacts and record the offer with its evidence; the event."""
    from orchestrator.trail import events as ev

    blob = fix.source.read_bytes()
    if hashlib.sha256(blob).hexdigest() != fix.diff_sha256:
        raise UsageError(f"offer {fix.offer}: its diff {fix.source} changed since it was read; ask again")
    name, sha, size = run.write_artifact_file(f"fixes/{fix.offer}.diff", blob)
    applies, why = diff_applies(run.state["target"], blob)
    offer = ev.FixOffered(
        offer=fix.offer, findings=[ev.FindingRef(code=c, subject=s) for c, s in matched], diff=name,
        diff_sha256=sha, files=list(fix.files), proofs=[ev.FixProof(**p) for p in fix.proofs],
        cleared_with=sorted({c for c, _ in fix.findings} - {c for c, _ in matched}), applies=applies,
        apply_check=why)
    return run.append_many([ev.ArtifactWritten(name=name, sha256=sha, bytes=size), offer],
                           phase=run.state["phase"] or None)[-1]


def diff_applies(target: str, diff: bytes) -> tuple[bool, str]:
    """(True, "") when ``git apply --check`` takes the diff in ``target``, else (False, git's reason)."""
    from orchestrator.git import git_apply

    try:
        git_apply(target, diff.decode("utf-8"), "--check")
    except UnicodeDecodeError:
        return False, "the diff is not UTF-8 text; apply it by hand"
    except UsageError as exc:
        return False, exc.message
    return True, ""


def offer_views(runs_dir: Path, state: dict[str, Any], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The offers for the run's open findings as ``explain`` shows them: evidence, the diff, whether it applies."""
    recorded = {e["data"]["offer"]: e for e in events if e["type"] == "fix_offered"}
    views = []
    for fix, matched in offers_for(runs_dir, state):
        blob = fix.source.read_bytes()
        text = blob.decode("utf-8", "replace")
        applies, why = diff_applies(state["target"], blob)
        event = recorded.get(fix.offer)
        also = sorted({c for c, _ in fix.findings} - {c for c, _ in matched})
        views.append({
            "offer": fix.offer, "for": [c for c, _ in matched], "findings": [list(ref) for ref in matched],
            "cleared_with": also, "what": _what(fix, also),
            "files": list(fix.files), "applies_cleanly": applies, "apply_check": why,
            "offered_seq": event["seq"] if event else None,
            "diff_artifact": event["data"]["diff"] if event else None,
            "proven_by": [{"run_id": p["run_id"], "evidence": {k: p[k] for k in (
                "phase", "raised_seq", "edit_seqs", "completed_seq", "cleared_seq", "passed_seq")},
                "edits_by": p["by"]} for p in fix.proofs],
            "diff": text[:SHOWN_DIFF_CHARS] + (f"... ({len(text) - SHOWN_DIFF_CHARS} more chars: read_artifact "
                                               "diff_artifact)" if len(text) > SHOWN_DIFF_CHARS else ""),
            "how": f"apply_fix with {{\"run_id\": \"{state['run_id']}\", \"offer\": \"{fix.offer}\"}}, or ignore it",
        })
    return views


def _what(fix: KnownFix, also: list[str]) -> str:
    first = fix.proofs[0]
    said = (f"the whole diff of {len(first['edit_seqs'])} edit(s) run {first['run_id']} made between the finding "
            f"and the completion without it, {len(fix.files)} file(s), applied whole")
    return said + (f"; it also cleared {', '.join(also)} there" if also else "")


def issues_with_offers(state: dict[str, Any], views: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The run's open findings, each with the ids of the offers made for it (``fix_offers``)."""
    target = state["target"]
    return [{**issue, "fix_offers": [v["offer"] for v in views if list(finding_ref(issue, target=target))
                                     in v["findings"]]} for issue in state["issues"]]


def offered_diff(run: Any, offer_id: str) -> tuple[str, dict[str, Any]]:
    """The diff text of an offer for the run's open findings (recording the offer first when it is new).

    Raises:
        UsageError: no such offer for the open findings now, or its diff is not UTF-8 text.
    """
    live = {fix.offer: (fix, matched) for fix, matched in offers_for(run.dir.parent, run.state)}
    if offer_id not in live:
        now = ", ".join(live) or "none"
        raise UsageError(f"no offer {offer_id!r} for the open findings of run {run.run_id} (offers now: {now}); "
                         "explain lists them under fix_offers")
    recorded = {e["data"]["offer"]: e for e in run.read_events() if e["type"] == "fix_offered"}
    event = recorded.get(offer_id) or record_offer(run, *live[offer_id])
    try:
        return run.artifact_path(event["data"]["diff"]).read_text(encoding="utf-8"), event["data"]
    except UnicodeDecodeError:
        raise UsageError(f"offer {offer_id}: the diff is not UTF-8 text; apply artifact {event['data']['diff']} "
                         "by hand") from None
