"""Each rewrite's own delta when one stack entry holds several (a combined submission).

A submission may carry several rewrites as several commits (``bench_lcp --combine``: one
confirmation for all, when device time allows one). The entry's confirmed delta then covers
them together. So the findings measure every prefix of the submitted branch replayed on the
entry's parent: the parent itself, then the parent plus the first k commits. Each prefix runs
with the regions the stack enabled before the entry plus those of the entry's named regions
that its commits so far declare (a named region no commit declares: from the first commit).

Each prefix gets one fresh process at the per-layer token counts (or the run's ``--delta-tokens``, a subset of
them: each prefix compiles its own code cold, so a count costs seconds a prefix). The skill labels such
single-run per-branch deltas indicative; the entry's 3-process confirmation stays the cited
number. Measured once per entry (record ``rewrite_deltas``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import git

from orchestrator.phase_api import PhaseContext
from phases.local_compile_perf.confirmed import build_cells, call_confirm, measured, record_cells
from phases.local_compile_perf.devlog import log
from phases.local_compile_perf.records import Plan
from phases.local_compile_perf.results import RewriteDeltas
from phases.local_compile_perf.region_offer import declared_at
from phases.local_compile_perf.stack import add_detached_worktree, remove_worktree
from phases.local_compile_perf.work.measure_trees import ConfirmRequest, Variant
from phases.local_compile_perf.workspace import replay

BASE = "before"
"""Variant name of the entry's parent (the stack before the entry)."""


def entry_commits(target: Path, entry: dict[str, Any]) -> list[git.Commit]:
    """The submitted branch's commits beyond its merge base with the entry's parent, oldest first."""
    repo = git.Repo(target)
    if entry["source_branch"] not in {h.name for h in repo.heads}:
        return []
    base = repo.git.merge_base(entry["source_branch"], entry["parent"])
    return [repo.commit(c) for c in repo.git.rev_list("--reverse", f"{base}..{entry['source_branch']}").split()]


def prefix_checkouts(target: Path, entry: dict[str, Any], root: Path) -> list[tuple[str, Path, str]]:
    """(name, worktree, subject) for the parent and each prefix of the entry's commits, replayed on the parent."""
    commits = entry_commits(target, entry)
    made = [(BASE, add_detached_worktree(target, entry["parent"], root / "prefix-0"), "the stack before the entry")]
    for k, commit in enumerate(commits, start=1):
        path = add_detached_worktree(target, entry["parent"], root / f"prefix-{k}")
        replay(git.Repo(path), [earlier.hexsha for earlier in commits[:k]])
        made.append((f"+{k}", path, commit.message.splitlines()[0]))
    return made


def prefix_regions(path: Path, entry: dict[str, Any], *, base: bool) -> tuple[str, ...]:
    """The stack's regions before the entry, plus (past the base) the entry's named regions this prefix has reached.

    A region the entry names is enabled from the first commit whose changed files declare it, or from the
    first commit when no file the entry changes declares it (the entry only enables it).
    """
    before = list(entry["stack_regions_before"])
    if base:
        return tuple(before)
    repo = git.Repo(path)
    so_far = declared_at(repo, "HEAD", repo.git.diff("--name-only", entry["parent"], "HEAD").split())
    by_entry = declared_at(repo, entry["commit"], list(entry.get("files", ())))
    reached = [r for r in entry["regions"] if r in so_far or r not in by_entry]
    return tuple(dict.fromkeys([*before, *reached]))


def rewrite_deltas_left(ctx: PhaseContext, entry: dict[str, Any]) -> bool:
    """Whether ``entry``'s rewrite deltas are still to measure (one worker call): unrecorded, two commits or more."""
    recorded = any(r.commit == entry["commit"] for r in ctx.records(RewriteDeltas))
    return not recorded and len(entry_commits(ctx.target, entry)) >= 2


def measure_rewrite_deltas(ctx: PhaseContext, plan: Plan, entry: dict[str, Any]) -> dict[str, Any] | None:
    """The ``rewrite_deltas`` record of ``entry`` (None when it holds one commit or fewer)."""
    done = [r for r in ctx.records(RewriteDeltas) if r.commit == entry["commit"]]
    if done:
        return done[-1].model_dump(mode="json")
    if len(entry_commits(ctx.target, entry)) < 2:
        return None
    root = ctx.scratch_dir / "worktrees" / f"deltas-{entry['commit'][:10]}"
    made = prefix_checkouts(ctx.target, entry, root)
    try:
        tokens = plan.delta_tokens or plan.sizes.per_layer_tokens
        variants = tuple(Variant(name=name, checkout=str(path), tokens=tokens,
                                 tree="regions:" + ",".join(prefix_regions(path, entry, base=name == BASE)))
                         for name, path, _subject in made)
        request = ConfirmRequest(harness=plan.harness, device=plan.device, variants=variants, runs=1,
                                 timing=plan.timing)
        rows = build_cells(call_confirm(ctx, request, label="rewrite deltas").model_dump(mode="json"), runs=1)
    finally:
        for _name, path, _subject in made:
            remove_worktree(ctx.target, path)
    record_cells(ctx, rows, purpose=f"rewrite deltas of {entry['branch']}", cited=False)
    record = {"commit": entry["commit"], "branch": entry["branch"], "tokens": list(tokens),
              "steps": delta_steps([(name, subject) for name, _path, subject in made], rows, tokens)}
    ctx.add_record("rewrite_deltas", record)
    for line in delta_lines(record):
        log(ctx, line, kind="measurement")
    return record


def delta_steps(names: list[tuple[str, str]], rows: list[Any], tokens: tuple[int, ...]) -> list[dict[str, Any]]:
    """Per prefix and token count: glue and wall, and the change from the prefix before it."""
    steps = []
    for i, (name, subject) in enumerate(names):
        per_tokens = []
        for t in tokens:
            now = measured(rows, name, t)
            before = measured(rows, names[i - 1][0], t) if i else None
            row: dict[str, Any] = {"tokens": t, "glue_ms": now and now.cited["glue_ms"],
                                   "wall_ms": now and now.cited["wall_ms"]}
            if now and before:
                row |= {"glue_delta_ms": now.cited["glue_ms"] - before.cited["glue_ms"],
                        "wall_delta_ms": now.cited["wall_ms"] - before.cited["wall_ms"]}
            per_tokens.append(row)
        steps.append({"name": name, "rewrite": subject, "per_tokens": per_tokens})
    return steps


def delta_lines(record: dict[str, Any]) -> list[str]:
    """One devlog line per prefix and token count of a ``rewrite_deltas`` record."""
    return [f"rewrite deltas of {record['branch']}: {step['name']} ({step['rewrite'][:60]}) at {row['tokens']} "
            f"tokens: {describe_delta(row)}" for step in record["steps"] for row in step["per_tokens"]]


def describe_delta(row: dict[str, Any]) -> str:
    if row["wall_ms"] is None:
        return "not measured (its fresh process FAILED: see the worker log)"
    glue, wall = f"glue {row['glue_ms']:.3f} ms", f"wall {row['wall_ms']:.3f} ms"
    if "glue_delta_ms" in row:
        glue, wall = f"{glue} ({row['glue_delta_ms']:+.3f})", f"{wall} ({row['wall_delta_ms']:+.3f})"
    return f"{glue}, {wall} (1 fresh process: indicative)"
