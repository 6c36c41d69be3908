"""The embedded target as a git workspace: pristine ``main`` plus one branch per candidate.

``materialize_embedded_workspace(state_dir)`` copies ``embedded/moe_layer`` (with the
package marker) as ``examples/moe_layer`` into ``state_dir/workspaces/moe-layer-<hash>/``, where the
hash covers the library and the candidate folders, so an edit to either makes a new
workspace instead of silently reusing a stale one. The tree is built once, by the bot, as every
pristine workspace is (``orchestrator.workspaces.build_pristine``: in a temporary folder, renamed
into place); an existing clean workspace is reused and only missing candidate branches are added.

Candidates live in ``embedded/candidates/<name>/`` (``meta.json`` + ``change.diff``); each
becomes one commit on its ``branch``, on top of ``main``, or for a rewrite written on others
(``after``), on top of their commits replayed on ``main`` in that order. Engine side:
GitPython only, no torch.
"""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path

import git
from pydantic import BaseModel, ConfigDict, ValidationError

from orchestrator.workspaces import BOT_EMAIL, BOT_NAME, build_pristine, commit_as_bot

PROJECT_ROOT = Path(__file__).resolve().parents[2]


EMBEDDED_ROOT = Path(__file__).resolve().parent / "embedded"
"""The embedded library (``moe_layer/``), copied into each workspace as the ``examples`` package
(inside our own namespace here: a top-level ``examples`` package would clash in site-packages)."""
CANDIDATES_DIR = EMBEDDED_ROOT / "candidates"


class WorkspaceError(RuntimeError):
    """The workspace cannot be made or reused; the message says what to do."""

    code = "workspace_unusable"


class CandidateMeta(BaseModel):
    """``candidates/<name>/meta.json``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    label: str
    pattern: int | None
    """Number in the skill's patterns list; None for a ladder step (enable or widen a region)."""
    branch: str
    regions: tuple[str, ...]
    files: tuple[str, ...]
    message: str
    after: tuple[str, ...] = ()
    """Candidates (folder names) whose changes this diff is written on; its branch holds them
    first, so its tip commit alone applies to a stack that has them."""


@dataclass(frozen=True, kw_only=True, slots=True)
class EmbeddedCandidate:
    """One candidate rewrite: its metadata and its change as a unified diff against main."""

    name: str
    meta: CandidateMeta
    diff: Path


def load_candidates(root: Path = CANDIDATES_DIR) -> tuple[EmbeddedCandidate, ...]:
    """Return every candidate under ``root``, sorted by name.

    Raises:
        WorkspaceError: listing every bad meta.json or change.diff at once.
    """
    candidates, problems = [], []
    for folder in sorted(p for p in root.iterdir() if (p / "meta.json").is_file()):
        try:
            meta = CandidateMeta.model_validate_json((folder / "meta.json").read_text())
        except ValidationError as exc:
            problems.append(f"{folder.name}/meta.json: {exc.error_count()} invalid field(s)")
            continue
        diff = folder / "change.diff"
        touched = sorted(line[6:] for line in diff.read_text().splitlines() if line.startswith("+++ b/")) \
            if diff.is_file() else []
        if touched != sorted(meta.files):
            problems.append(f"{folder.name}: change.diff touches {touched}, meta.json lists {sorted(meta.files)}")
        candidates.append(EmbeddedCandidate(name=folder.name, meta=meta, diff=diff))
    problems += _unknown_after(candidates)
    if problems:
        raise WorkspaceError(f"{len(problems)} bad candidate(s) in {root}: " + "; ".join(problems))
    return _after_first(candidates)


def _unknown_after(candidates: list[EmbeddedCandidate]) -> list[str]:
    names = {c.name for c in candidates}
    return [f"{c.name}/meta.json: after names unknown candidate(s) {sorted(set(c.meta.after) - names)}"
            for c in candidates if set(c.meta.after) - names]


def _after_first(candidates: list[EmbeddedCandidate]) -> tuple[EmbeddedCandidate, ...]:
    """Name order, except that a candidate comes after every candidate it is written on."""
    by_name, ordered, placing = {c.name: c for c in candidates}, {}, set()

    def place(c: EmbeddedCandidate) -> None:
        if c.name in ordered:
            return
        if c.name in placing:
            raise WorkspaceError(f"candidate {c.name}: its after list loops back to it")
        placing.add(c.name)
        for dep in c.meta.after:
            place(by_name[dep])
        ordered[c.name] = c

    for candidate in candidates:
        place(candidate)
    return tuple(ordered.values())


def library_files(root: Path = EMBEDDED_ROOT) -> tuple[Path, ...]:
    """Workspace-relative paths (``examples/...``) of the library files, sorted."""
    package = [
        Path("examples") / p.relative_to(root)
        for p in sorted((root / "moe_layer").rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    ]
    return (Path("examples") / "__init__.py", *package)


def library_source(rel: Path, root: Path = EMBEDDED_ROOT) -> Path:
    """Where the workspace file ``rel`` (``examples/...``) comes from."""
    return root / rel.relative_to("examples")


def compute_content_hash(*, root: Path = EMBEDDED_ROOT, candidates_root: Path = CANDIDATES_DIR) -> str:
    """Return 12 hex digits of sha256 over the library files and the candidate folders."""
    digest = hashlib.sha256()
    tracked = [(str(p), library_source(p, root)) for p in library_files(root)]
    tracked += [
        (f"candidates/{p.relative_to(candidates_root)}", p)
        for p in sorted(candidates_root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    ]
    for name, path in tracked:
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def materialize_embedded_workspace(state_dir: Path) -> Path:
    """Return the path of a clean embedded workspace, creating it when needed.

    Args:
        state_dir: the orchestrator state folder; the workspace goes under
            ``state_dir/workspaces/``.

    Raises:
        WorkspaceError: the workspace exists but has uncommitted changes, or is not on
            a git repository.
    """
    candidates = load_candidates()
    path = Path(state_dir) / "workspaces" / f"moe-layer-{compute_content_hash()}"
    if path.exists():
        return _reuse_workspace(path, candidates)
    branches = {c.name: c.meta.branch for c in candidates}

    def commit_candidates(repo: git.Repo) -> None:
        for candidate in candidates:
            _commit_candidate(repo, candidate, branches)

    return build_pristine(path, _copy_library, on_top=commit_candidates)


def _copy_library(folder: Path) -> str:
    for rel in library_files():
        dst = folder / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(library_source(rel), dst)
    return "moe_layer: pristine library"


def _commit_candidate(repo: git.Repo, candidate: EmbeddedCandidate, branches: dict[str, str]) -> None:
    """Add ``candidate`` as one commit on its branch (on ``main`` plus its ``after`` tips); back on main after."""
    repo.git.checkout("-b", candidate.meta.branch, "main")
    try:
        replay(repo, [branches[dep] for dep in candidate.meta.after])
        repo.git.apply(str(candidate.diff))
        repo.index.add(list(candidate.meta.files))
        commit_as_bot(repo, f"{candidate.meta.message}\n\nCandidate: {candidate.name} "
                            f"({_pattern_note(candidate.meta.pattern)})")
    finally:
        repo.git.checkout("main")


def replay(repo: git.Repo, commits: list[str]) -> None:
    """Cherry-pick ``commits`` in order onto the checked-out HEAD, committed by the bot (no git identity needed)."""
    with repo.git.custom_environment(GIT_COMMITTER_NAME=BOT_NAME, GIT_COMMITTER_EMAIL=BOT_EMAIL):
        for commit in commits:
            repo.git.cherry_pick(commit)


def _pattern_note(pattern: int | None) -> str:
    return f"pattern {pattern}" if pattern is not None else "ladder step, no numbered pattern"


def _reuse_workspace(path: Path, candidates: tuple[EmbeddedCandidate, ...]) -> Path:
    try:
        repo = git.Repo(path)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
        raise WorkspaceError(f"workspace {path} is not a git repository; delete it and rerun") from exc
    if repo.is_dirty(untracked_files=True):
        raise WorkspaceError(
            f"workspace {path} has uncommitted changes ({', '.join(_dirty_paths(repo))}); "
            f"commit them on a branch or run `git -C {path} checkout -- . && git clean -fd`"
        )
    heads = {head.name for head in repo.heads}
    missing = [c for c in candidates if c.meta.branch not in heads]
    if missing:
        active = repo.active_branch.name
        repo.git.checkout("main")
        branches = {c.name: c.meta.branch for c in candidates}
        for candidate in missing:
            _commit_candidate(repo, candidate, branches)
        repo.git.checkout(active)
    return path


def _dirty_paths(repo: git.Repo) -> list[str]:
    changed = [item.a_path for item in repo.index.diff(None)]
    return sorted(changed + list(repo.untracked_files))[:10]


def describe_workspace(path: Path) -> dict[str, str]:
    """Return ``{branch: commit hexsha}`` for every branch of the workspace (for the trail)."""
    repo = git.Repo(path)
    return {head.name: head.commit.hexsha for head in repo.heads}


def candidate_regions() -> dict[str, tuple[str, ...]]:
    """Return ``{branch: regions to enable}`` for every shipped candidate."""
    return {c.meta.branch: c.meta.regions for c in load_candidates()}
