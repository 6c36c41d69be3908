"""Where a witnessed head is kept: a file path, or ``git:REPO`` (ref ``refs/orchestrator/witness/<run_id>``).

A witness is a copy of a run's signed head kept where this machine cannot rewrite it silently
(another host's file, a repository pushed elsewhere). ``audit --witness`` then checks that the
trail still extends it (``inspector``).
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.errors import UsageError
from orchestrator.trail.trail_io import atomic_write

GIT_PREFIX = "git:"


def witness_ref(run_id: str) -> str:
    return f"refs/orchestrator/witness/{run_id}"


def write_witness(spec: str, run_id: str, record: bytes) -> str:
    """Store ``record`` at ``spec``; returns where, in words."""
    if spec.startswith(GIT_PREFIX):
        repo = _repo(spec)
        from io import BytesIO

        from gitdb import IStream

        blob = repo.odb.store(IStream("blob", len(record), BytesIO(record))).hexsha
        repo.git.update_ref(witness_ref(run_id), blob.decode() if isinstance(blob, bytes) else blob)
        return f"{witness_ref(run_id)} of {repo.working_dir}"
    path = Path(spec)
    if not path.parent.is_dir():
        raise UsageError(f"{path.parent} is not a directory")
    atomic_write(path, record)
    return str(path)


def read_witness(spec: str, run_id: str) -> tuple[str, bytes | None]:
    """(where, the witnessed record or None when there is none to read)."""
    if spec.startswith(GIT_PREFIX):
        import git

        repo = _repo(spec)
        try:
            return f"{witness_ref(run_id)} of {repo.working_dir}", repo.git.cat_file(
                "blob", witness_ref(run_id), stdout_as_string=False)
        except git.GitCommandError:
            return f"{witness_ref(run_id)} of {repo.working_dir}", None
    try:
        return spec, Path(spec).read_bytes()
    except OSError:
        return spec, None


def _repo(spec: str):  # noqa: ANN202 (git.Repo, imported lazily)
    import git

    try:
        return git.Repo(spec[len(GIT_PREFIX):])
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise UsageError(f"{spec[len(GIT_PREFIX):]!r} is not a git repository") from None
