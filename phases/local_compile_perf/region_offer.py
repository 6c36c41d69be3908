"""Which regions a candidate may enable, read from git revisions (no checkout needed).

A candidate enables exactly the regions it names. Where its changes touch regions the
stack does not enable (they change lines of the function that declares one, or declare a
new one), those are offered to the agent by name (the submission is refused until it names
them or says "none"; the waiting pick_fix phase lists what the stack tip declares and does
not enable), so no region is ever enabled by default. A region declared elsewhere in the
branch's tree may still be named: the submission records that its changes do not touch it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import git

from phases.local_compile_perf.tree_adapter import EMBEDDED_SETTINGS, REGION_API_NAME, declared_region_names

HUNK = re.compile(r"^@@ -\S+ \+(\d+)(?:,(\d+))? @@", re.MULTILINE)
"""A ``git diff -U0`` hunk header; the groups are the branch side's first line and line count."""
DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


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
    """Regions ``branch``'s changes touch (see ``touched``) that the recipe at ``tip`` does not enable."""
    on = set(enabled_at(git.Repo(target), tip))
    return {name: path for name, path in touched(target, branch, tip).items() if name not in on}


def touched(target: Path, branch: str, tip: str) -> dict[str, str]:
    """``{region: path}`` of the regions whose declaring function ``branch`` changes past its merge base with
    ``tip``, and of those it declares that the merge base does not."""
    repo = git.Repo(target)
    base = repo.git.merge_base(branch, tip)
    before = declared_at(repo, base)
    found: dict[str, str] = {}
    for path in repo.git.diff("--name-only", "--no-renames", base, branch).splitlines():
        text = _text_at(repo, branch, path) if path.endswith(".py") else None
        if text is None:
            continue
        lines = changed_lines(repo, base, branch, path)
        for name, first, last in region_spans(text):
            if name not in before or any(first <= n <= last for n in lines):
                found.setdefault(name, path)
    return found


def _text_at(repo: git.Repo, rev: str, path: str) -> str | None:
    try:
        return repo.git.show(f"{rev}:{path}")
    except git.GitCommandError:  # deleted on the branch
        return None


def changed_lines(repo: git.Repo, base: str, branch: str, path: str) -> set[int]:
    """Line numbers of ``path`` on ``branch`` that differ from ``base``; a pure deletion marks the two lines
    around it."""
    diff = repo.git.diff("-U0", "--no-ext-diff", "--no-renames", base, branch, "--", path)
    lines: set[int] = set()
    for match in HUNK.finditer(diff):
        start, count = int(match.group(1)), int(match.group(2) or 1)
        lines.update(range(start, start + count) if count else (start, start + 1))
    return lines


def region_spans(source: str) -> list[tuple[str, int, int]]:
    """(region, first line, last line) of the innermost def or class around each declaration in ``source``,
    decorators included; a declaration outside every def spans the whole file."""
    declared = declared_region_names(source)
    if not declared:  # nothing, or a file that does not parse
        return []
    spans = [_span(node) for node in ast.walk(ast.parse(source)) if isinstance(node, DEFS)]
    whole = (1, max(1, len(source.splitlines())))
    found = []
    for name, line in declared:
        around = [span for span in spans if span[0] <= line <= span[1]]
        found.append((name, *min(around, key=lambda span: span[1] - span[0], default=whole)))
    return found


def _span(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> tuple[int, int]:
    return min([node.lineno, *(d.lineno for d in node.decorator_list)]), node.end_lineno or node.lineno


def not_enabled(target: Path, tip: str) -> dict[str, str]:
    """Regions declared anywhere in the tree at ``tip`` that its recipe does not enable."""
    repo = git.Repo(target)
    on = set(enabled_at(repo, tip))
    return {name: path for name, path in declared_at(repo, tip).items() if name not in on}
