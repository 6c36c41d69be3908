"""The diff stack in the target repo: candidate worktrees, stack branches, scope checks (GitPython).

A submitted branch is replayed onto the current stack tip as ONE commit on ``wip/<n>-<slug>``
(cherry-pick of every commit the branch has beyond its merge base with the tip), checked
out in its own worktree next to a detached worktree of the tip, so the stack and the
candidate can be measured side by side in fresh processes. A validated candidate becomes
``stack/<n>-<slug>`` (based on ``stack/<n-1>``, so the stack is linear by construction and
checked with ``git merge-base --is-ancestor``); a rejected one is kept as
``rejected/<n>-<slug>`` for inspection. Worktrees live under the run's ``scratch_dir/worktrees/``.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import git

from orchestrator.phase_api import PhaseContext
from orchestrator.workflow import load_workflow
from orchestrator.workspaces import commit_as_bot
from phases.local_compile_perf.records import Candidate, PreparedCandidate
from phases.local_compile_perf.results import CandidateVerdict
from phases.local_compile_perf.tree_adapter import EMBEDDED_SETTINGS, read_embedded_settings

SHARED_DEFAULT_FILES = ("examples/moe_layer/local_compile.py", "torchtitan/distributed/local_compile.py",
                        "torchtitan/config/job_config.py")
"""Files holding region machinery or defaults shared by every model: never where a region is enabled."""
_RECIPE_LINE = re.compile(r"^(UPSTREAM_REGIONS\s*:\s*tuple\[str, \.\.\.\]\s*=\s*)\((.*)\)\s*$", re.M)


class CandidateRefused(Exception):
    """The candidate cannot be tried on the stack; the message says why."""


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "candidate"


def stack_entries(state: dict[str, Any]) -> list[dict[str, Any]]:
    return list(state["records"].get("stack_entry", []))


def stack_tip(state: dict[str, Any]) -> str:
    entries = stack_entries(state)
    return entries[-1]["commit"] if entries else state["base"]["commit"]


def worktree_root(ctx: PhaseContext) -> Path:
    return ctx.scratch_dir / "worktrees"


def recipe_regions(checkout: Path) -> tuple[str, ...]:
    """Regions the checkout's recipe enables (embedded: trainer_settings.UPSTREAM_REGIONS)."""
    if (checkout / EMBEDDED_SETTINGS).is_file():
        return tuple(read_embedded_settings(checkout).get("UPSTREAM_REGIONS", ()))
    return ()


def prepare_candidate(target: Path, *, state: dict[str, Any], submission: Candidate,
                      root: Path) -> PreparedCandidate:
    """Replay the submitted branch on the stack tip; two worktrees (tip, candidate). CandidateRefused if impossible."""
    repo = git.Repo(target)
    branch, tip = submission.branch, stack_tip(state)
    if branch not in {h.name for h in repo.heads}:
        raise CandidateRefused(f"branch {branch!r} does not exist in {target}")
    merge_base = repo.git.merge_base(branch, tip)
    commits = repo.git.rev_list("--reverse", f"{merge_base}..{branch}").split()
    if not commits:
        raise CandidateRefused(f"branch {branch!r} has no commits beyond the stack tip {tip[:10]}")
    n = len(load_workflow(state["workflow"]).records_in(state, CandidateVerdict)) + 1
    name = f"{n}-{slug(submission.label)}"
    stack_dir, cand_dir = root / f"{name}-stack", root / f"{name}-candidate"
    _clean_worktree(repo, stack_dir)
    _clean_worktree(repo, cand_dir)
    root.mkdir(parents=True, exist_ok=True)
    repo.git.worktree("add", "--detach", str(stack_dir), tip)
    repo.git.worktree("add", "-B", f"wip/{name}", str(cand_dir), tip)
    wt = git.Repo(cand_dir)
    try:
        wt.git.cherry_pick("--no-commit", *commits)
    except git.GitCommandError as exc:
        try:
            wt.git.cherry_pick("--abort")
        except git.GitCommandError:
            wt.git.reset("--hard", tip)
        raise CandidateRefused(f"branch {branch!r} does not apply on the stack tip {tip[:10]}: "
                               f"{str(exc).splitlines()[-1][:200]}") from None
    messages = [repo.commit(c).message.strip() for c in commits]
    commit_as_bot(wt, f"{submission.label}\n\n" + "\n\n".join(messages))
    files = wt.git.diff("--name-only", tip, "HEAD").split()
    regions = tuple(submission.regions)
    return PreparedCandidate(
        n=n, name=name, tip=tip, commits=tuple(commits), wip_branch=f"wip/{name}", wip_commit=wt.head.commit.hexsha,
        stack_checkout=str(stack_dir), candidate_checkout=str(cand_dir), files=tuple(files), candidate_regions=regions,
        regions_source="named by the submission" if regions else "none named",
        stack_regions=recipe_regions(stack_dir))


def _clean_worktree(repo: git.Repo, path: Path) -> None:
    if path.exists():
        try:
            repo.git.worktree("remove", "--force", str(path))
        except git.GitCommandError:
            shutil.rmtree(path, ignore_errors=True)
    repo.git.worktree("prune")


def add_detached_worktree(target: Path, commit: str, path: Path) -> Path:
    """A detached worktree of ``commit`` at ``path`` (replacing a stale one)."""
    repo = git.Repo(target)
    _clean_worktree(repo, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    repo.git.worktree("add", "--detach", str(path), commit)
    return path


def remove_worktree(target: Path, path: Path) -> None:
    _clean_worktree(git.Repo(target), path)


def release_candidate(target: Path, prepared: PreparedCandidate, *, keep_as: str | None) -> str | None:
    """Remove both worktrees; rename the wip branch to ``keep_as`` (or delete it). Returns the kept commit."""
    repo = git.Repo(target)
    for checkout in (prepared.stack_checkout, prepared.candidate_checkout):
        _clean_worktree(repo, Path(checkout))
    heads = {h.name: h for h in repo.heads}
    wip = heads.get(prepared.wip_branch)
    if wip is None:
        return None
    commit = wip.commit.hexsha
    if keep_as:
        repo.git.branch("-f", keep_as, commit)
    repo.git.branch("-D", prepared.wip_branch)
    return commit


def enable_in_recipe(checkout: Path, regions: Sequence[str]) -> str | None:
    """Add ``regions`` to the embedded recipe's UPSTREAM_REGIONS and amend the candidate commit.

    Returns the recipe path edited, or None when nothing was missing or the target has no
    embedded recipe (a torchtitan tree enables regions in its model config: the agent's edit).
    """
    path = checkout / EMBEDDED_SETTINGS
    if not path.is_file():
        return None
    current = list(recipe_regions(checkout))
    missing = [r for r in regions if r not in current]
    if not missing:
        return None
    text = path.read_text()
    names = ", ".join(f'"{r}"' for r in current + missing)
    new, count = _RECIPE_LINE.subn(lambda m: f"{m.group(1)}({names}{',' if len(current + missing) == 1 else ''})", text)
    if count != 1:
        raise CandidateRefused(f"{EMBEDDED_SETTINGS}: cannot find one UPSTREAM_REGIONS tuple line to enable {missing}")
    path.write_text(new)
    repo = git.Repo(checkout)
    repo.index.add([str(EMBEDDED_SETTINGS)])
    message = repo.head.commit.message.rstrip() + f"\n\nEnables regions {missing} in {EMBEDDED_SETTINGS} (the recipe)."
    # NOTE: an amend through the index (not `git commit --amend`), so no git identity is needed.
    commit_as_bot(repo, message, parent_commits=list(repo.head.commit.parents), head=True)
    return str(EMBEDDED_SETTINGS)


def check_scope(checkout: Path, *, parent: str, regions: Sequence[str]) -> dict[str, Any]:
    """Files of the change, added lines naming a region in a shared default file, reaching recipes."""
    repo = git.Repo(checkout)
    files = repo.git.diff("--name-only", parent, "HEAD").split()
    hits = []
    for rel in files:
        if rel in SHARED_DEFAULT_FILES:
            added = [l[1:] for l in repo.git.diff(parent, "HEAD", "--", rel).splitlines()
                     if l.startswith("+") and not l.startswith("+++")]
            hits += [f"{rel}: {l.strip()}" for l in added if any(f'"{r}"' in l or f"'{r}'" in l for r in regions)]
    recipes = [f"{EMBEDDED_SETTINGS} (the embedded trainer recipe; no config subclasses it)"] \
        if (checkout / EMBEDDED_SETTINGS).is_file() else []
    return {"files": files, "shared_default_edits": hits, "reaching_recipes": recipes}


def commit_stack_entry(target: Path, prepared: PreparedCandidate, *, previous: str, position: int,
                       label: str) -> dict[str, Any]:
    """Turn the candidate worktree's HEAD into ``stack/<position>-<label>``; verify it descends from ``previous``."""
    repo = git.Repo(target)
    commit = git.Repo(prepared.candidate_checkout).head.commit.hexsha
    branch = f"stack/{position}-{slug(label)}"
    repo.git.branch("-f", branch, commit)
    linear = is_ancestor(target, previous, commit)
    return {"branch": branch, "commit": commit, "parent": previous, "linear": linear}


def is_ancestor(target: Path, older: str, newer: str) -> bool:
    try:
        git.Repo(target).git.merge_base("--is-ancestor", older, newer)
    except git.GitCommandError:
        return False
    return True
