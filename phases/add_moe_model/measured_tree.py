"""What numerics measured: the experiment folder's files, checked again before the doc and the commit.

Numerics records, just before its worker imports the target, the blob id of every file under the
experiment folder that differs from the base (``measured_tree``: path -> blob id, None for a deleted
file; a file not listed is the base's). The doc and commit phases compare the folder with it. An edit
made after numerics (the agent's during parallelism, or one made by hand) sends the run back to numerics
(route ``remeasure``), which measures the edited folder and leads on through parallelism to the doc and
the commit again, so nothing is documented or committed that numerics did not measure.
MODEL_COMPATIBILITY.md is left out: the doc phase itself writes it after numerics.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from orchestrator.git import blob_hash, changed_paths
from orchestrator.phase_api import Issue, PhaseContext, PhaseResult
from phases.add_moe_model.records import Numerics, Remeasure
from phases.add_moe_model.workspace import EXP

KEY = "measured_tree"
REMEASURE = "remeasure"
RECORD = "remeasure"
DOC = EXP + "MODEL_COMPATIBILITY.md"
# NOTE: each edit after numerics costs one trip back; a folder that still differs after this many is most
# likely rewritten by something that runs between numerics and the commit, and a trip back runs on without
# stopping, so the run stops instead of looping.
MAX_TRIPS = 5


def snapshot_experiment(target: str | Path, base_commit: str) -> dict[str, str | None]:
    """Blob id of each file under the experiment folder that differs from ``base_commit`` (None: deleted)."""
    paths = [p for p in changed_paths(target, base_commit) if p.startswith(EXP) and p != DOC]
    return {path: blob_hash(target, path) for path in paths}


def describe_changes(measured: dict[str, str | None], now: dict[str, str | None]) -> list[str]:
    """"path (changed)", "path (deleted)" or "path (back to the base)" for each file that differs."""
    base = object()
    changes = []
    for path in sorted(set(measured) | set(now)):
        before, after = measured.get(path, base), now.get(path, base)
        if before == after:
            continue
        kind = "back to the base" if after is base else "deleted" if after is None else "changed"
        changes.append(f"{path} ({kind})")
    return changes


def check_measured(ctx: PhaseContext, *, phase: str) -> PhaseResult | None:
    """None when the folder is what numerics measured; else the result that sends the run back to numerics."""
    measured = ctx.result("numerics", Numerics).measured_tree if "numerics" in ctx.results else None
    now = snapshot_experiment(ctx.target, ctx.base["commit"])
    if measured == now:
        return None
    changes = (describe_changes(measured, now) if measured is not None
               else ["numerics recorded no snapshot of the experiment folder (a run from before it did)"])
    trips = len(ctx.records(Remeasure))
    if trips >= MAX_TRIPS:
        return keeps_changing(phase, changes, trips=trips)
    ctx.add_record(RECORD, Remeasure(phase=phase, changes=tuple(changes), measured=measured, now=now))
    summary = (f"{phase}: the experiment folder changed since numerics measured it: {'; '.join(changes)}. Not "
               f"{'committed' if phase == 'commit' else 'documented'}: the run goes back to numerics, which measures "
               f"the edited folder and leads on through parallelism to {phase} again (`advance` does it; revert an "
               "edit first if it was not meant to be part of the model)")
    return PhaseResult(outcome="passed", route=REMEASURE, summary=summary,
                       data={"remeasure": {"changes": changes}})


def keeps_changing(phase: str, changes: list[str], *, trips: int) -> PhaseResult:
    message = (f"the experiment folder still differs from what numerics measured after {trips} trips back to it: "
               f"{'; '.join(changes)}")
    return PhaseResult(outcome="failed", summary=f"{phase}: {message}", issues=(Issue(
        code="experiment_folder_keeps_changing", message=message,
        fix_location="whatever writes these files between numerics and the commit (a tool run in the target, or "
                     "phases/add_moe_model/measured_tree.py if the files are ours); a person finds it, then aborts "
                     "the run and starts a new one: nothing unmeasured is committed"),))


def with_snapshot(result: PhaseResult, snapshot: dict[str, str | None]) -> PhaseResult:
    """``result`` with what numerics measured in its data."""
    return dataclasses.replace(result, data={**result.data, KEY: snapshot})
