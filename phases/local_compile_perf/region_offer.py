"""Which regions a candidate may enable, read from git revisions (no checkout needed).

A candidate enables exactly the regions it names. Where its changed files declare regions
the stack does not enable, those are offered to the agent by name (the submission is
refused until it names them or says "none"; the waiting pick_fix phase lists what the
stack tip declares and does not enable), so no region is ever enabled by default.
"""

from __future__ import annotations

import ast
from pathlib import Path

import git

from phases.local_compile_perf.tree_adapter import EMBEDDED_SETTINGS, REGION_API_NAME, declared_region_names


def declared_at(repo: git.Repo, rev: str, paths: list[str] | None = None) -> dict[str, str]:
    """``{region: path}`` of every region declared in ``paths`` (default: every .py file naming the API) at ``rev``."""
    if paths is None:
        try:
            paths = [hit.split(":", 1)[1] for hit in repo.git.grep("-l", REGION_API_NAME, rev, "--", "*.py").split()]
        except git.GitCommandError:
            paths = []
    found: dict[str, str] = {}
    for path in paths:
        if not path.endswith(".py"):
            continue
        try:
            text = repo.git.show(f"{rev}:{path}")
        except git.GitCommandError:
            continue
        for name, _line in declared_region_names(text):
            found.setdefault(name, path)
    return found


def enabled_at(repo: git.Repo, rev: str) -> tuple[str, ...]:
    """Regions the embedded recipe enables at ``rev`` (empty for a tree without one)."""
    try:
        text = repo.git.show(f"{rev}:{EMBEDDED_SETTINGS.as_posix()}")
    except git.GitCommandError:
        return ()
    for node in ast.parse(text).body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and target.id == "UPSTREAM_REGIONS" and node.value is not None:
            return tuple(ast.literal_eval(node.value))
    return ()


def offered(target: Path, branch: str, tip: str) -> dict[str, str]:
    """Regions declared in the files ``branch`` changes (past its merge base with ``tip``), not enabled at ``tip``."""
    repo = git.Repo(target)
    base = repo.git.merge_base(branch, tip)
    files = repo.git.diff("--name-only", base, branch).split()
    on = set(enabled_at(repo, tip))
    return {name: path for name, path in declared_at(repo, branch, files).items() if name not in on}


def not_enabled(target: Path, tip: str) -> dict[str, str]:
    """Regions declared anywhere in the tree at ``tip`` that its recipe does not enable."""
    repo = git.Repo(target)
    on = set(enabled_at(repo, tip))
    return {name: path for name, path in declared_at(repo, tip).items() if name not in on}
