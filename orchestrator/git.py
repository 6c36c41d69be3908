"""GitPython helpers the engine and guards share: base capture, changed paths, blob hashes.

Imports GitPython lazily so that read-only commands (status, audit) do not pay for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.errors import UsageError


def open_repo(path: str | Path) -> Any:
    """The git.Repo at ``path`` (its top level); UsageError when it is not a git checkout."""
    import git

    try:
        repo = git.Repo(path, search_parent_directories=False)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise UsageError(f"{path} is not a git checkout; pass the root of a git repository") from None
    if repo.bare:
        raise UsageError(f"{path} is a bare repository; pass a checkout with a work tree")
    return repo


def capture_base(path: str | Path) -> dict[str, Any]:
    """Commit, branch (None when detached) and `git status --porcelain` lines before any edit."""
    repo = open_repo(path)
    try:
        commit = repo.head.commit.hexsha
    except ValueError:
        raise UsageError(f"{path} has no commits; commit the pristine tree first") from None
    branch = None if repo.head.is_detached else repo.active_branch.name
    status = repo.git.status("--porcelain", "--untracked-files=all").splitlines()
    return {"commit": commit, "branch": branch, "status": status}


def changed_paths(path: str | Path, base_commit: str) -> list[str]:
    """Paths that differ from ``base_commit``: committed since, staged, unstaged or untracked."""
    repo = open_repo(path)
    tracked = repo.git.diff("--name-only", base_commit, "--").splitlines()
    untracked = repo.untracked_files
    return sorted(set(tracked) | set(untracked))


def blob_hash(path: str | Path, relpath: str) -> str | None:
    """`git hash-object` of the working-tree file, or None when it does not exist."""
    file = Path(path) / relpath
    if not file.is_file():
        return None
    return open_repo(path).git.hash_object(str(file))


def base_blob_hash(path: str | Path, base_commit: str, relpath: str) -> str | None:
    """The blob id of ``relpath`` at ``base_commit``, or None when it did not exist there."""
    repo = open_repo(path)
    try:
        return repo.git.rev_parse(f"{base_commit}:{relpath}")
    except Exception:  # noqa: BLE001 (git exits 128 for a missing path)
        return None


def head_commit(path: str | Path) -> str:
    return open_repo(path).head.commit.hexsha


def git_apply(target: str | Path, diff: str, *flags: str) -> str:
    """Run ``git apply [flags] -`` in ``target``; UsageError naming git's reason when it fails."""
    import subprocess

    proc = subprocess.run(["git", "-C", str(target), "apply", "--whitespace=nowarn", *flags],
                          input=diff, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        reason = (proc.stderr.strip().splitlines() or ["git apply failed"])[0]
        raise UsageError(f"the diff does not apply to {target}: {reason}")
    return proc.stdout


def diff_paths(target: str | Path, diff: str) -> list[str]:
    """Every path ``git apply`` would touch (sources of renames and copies included)."""
    out = git_apply(target, diff, "--numstat", "-z")
    paths = {field.split("\t", 2)[2] for field in out.split("\0") if field.count("\t") >= 2}
    # NOTE: git apply's numstat names only the destination of a rename; the source comes from
    # the extended header lines, which cannot occur inside a hunk (hunk lines start with " +-\").
    for line in diff.splitlines():
        for header in ("rename from ", "copy from "):
            if line.startswith(header):
                paths.add(line[len(header):].strip().strip('"'))
    return sorted(p for p in paths if p)


def clear_dead_git_locks(path: str | Path) -> list[str]:
    """Remove the lock files that git commands killed mid-write left in the git dir of ``path``; their paths.

    Git writes no owner into a lock, but it keeps the lock's descriptor open until it renames the
    file into place, so a lock that no live process has open was left by a command that died
    (``index.lock`` after a kill during ``git status``, ``checkout`` or ``reset``; ``HEAD.lock``, a
    ref's lock). Every later git write would fail on it with exit 128. A lock some process still
    holds is left alone. Where the system lists no open files (no ``/proc``), every lock counts as
    dead: call this only while the run's lock is held.
    """
    git_dir = Path(path) / ".git"
    if git_dir.is_file():  # a linked worktree: ".git" names its git dir
        git_dir = Path(path, git_dir.read_text().removeprefix("gitdir:").strip())
    if not git_dir.is_dir():
        return []
    locks = [p for p in (*git_dir.glob("*.lock"), *git_dir.glob("refs/**/*.lock"), *git_dir.glob("worktrees/*/*.lock"))
             if p.is_file()]
    if not locks:
        return []
    held = files_held_open()
    removed = []
    for lock in sorted(locks):
        if str(lock.resolve()) not in held:
            lock.unlink(missing_ok=True)
            removed.append(str(lock))
    return removed


def files_held_open() -> set[str]:
    """Every path a live process has open, as far as ``/proc`` shows (empty where there is no ``/proc``)."""
    import os

    held: set[str] = set()
    proc = Path("/proc")
    for pid in (p for p in proc.iterdir() if p.name.isdigit()) if proc.is_dir() else ():
        try:
            fds = list((pid / "fd").iterdir())
        except OSError:  # gone, or another user's
            continue
        for fd in fds:
            try:
                held.add(os.readlink(fd))
            except OSError:
                continue
    return held


def uncommitted_left(target: str, base: dict[str, Any]) -> str:
    """What an abort leaves in the target: uncommitted changes beyond those there at start ("" when none)."""
    try:
        status = open_repo(target).git.status("--porcelain", "--untracked-files=all").splitlines()
    except UsageError:  # the target is gone or no longer a checkout: nothing to say about it
        return ""
    new = [line[3:] for line in status if line not in set(base.get("status") or ())]
    if not new:
        return ""
    shown = ", ".join(new[:8]) + (f" and {len(new) - 8} more" if len(new) > 8 else "")
    return (f"the target keeps {len(new)} uncommitted change(s) made during the run, left as they are (the abort "
            f"reverts nothing): {shown}")
