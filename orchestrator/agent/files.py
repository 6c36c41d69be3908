"""Scoped file access for agents: reads stay inside the run's target, writes inside the phase's scope.

Every path an agent names goes through ``resolve_in_target`` first: relative paths are taken
from the target's root, ``..`` components and ``.git`` are refused outright, an absolute path
is accepted only when it lies inside the target, and the path is resolved through symlinks
before it is compared, so a link that points outside (or from ``allowed/`` back into the
rest of the tree) cannot be used to escape. Writes (``write_text``, ``replace_once``,
``apply_unified_diff``) must also land under one of the phase's ``allowed_paths``. The same
check backs the ``orchestrator check-path`` hook; the engine's guards re-check the tree from
git at every advance, so this module is a live fence, not the referee.

stdlib only (git runs as a subprocess): the CLI's hook command must start fast.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from orchestrator.errors import UsageError
from orchestrator.git import diff_paths as shared_diff_paths
from orchestrator.git import git_apply

MAX_READ_CHARS = 60_000


class ScopeRefused(UsageError):
    """An agent named a path it may not read or write; nothing was touched."""

    code = "scope_refused"
    details: dict[str, object] = {}
    """Fields the tool's answer carries in ``data`` beside ``code`` (e.g. ``matches``)."""


class EditMatchRefused(ScopeRefused):
    """``edit_file``'s old text does not match exactly once; the file is unchanged."""

    def __init__(self, message: str, *, matches: int) -> None:
        super().__init__(message)
        self.details = {"matches": matches}


class EditNoMatch(EditMatchRefused):
    """``edit_file``'s old text is not in the file."""

    code = "edit_no_match"


class EditNotUnique(EditMatchRefused):
    """``edit_file``'s old text matches several times."""

    code = "edit_not_unique"


@dataclass(frozen=True, kw_only=True, slots=True)
class Scope:
    """Where an agent may work in one run right now.

    Attributes:
        target: absolute path of the run's git checkout, e.g. "/work/torchtitan".
        phase: the phase the run waits in, e.g. "fix".
        allowed_paths: prefixes relative to the target an agent may edit, e.g. ("allowed/",).
    """

    target: Path
    phase: str
    allowed_paths: tuple[str, ...]
    frozen: tuple[str, ...] = ()
    """Paths no agent may edit in any phase (e.g. the numerics script's thresholds)."""


def resolve_in_target(target: Path, path: str) -> tuple[Path, str]:
    """(resolved absolute path, POSIX path relative to the target); ScopeRefused on any escape."""
    root = target.resolve()
    if not path or "\x00" in path:
        raise ScopeRefused("empty path; name a file relative to the run's target")
    raw = PurePosixPath(path.replace(os.sep, "/"))
    if ".." in raw.parts:
        raise ScopeRefused(f"{path!r} contains '..'; name the file relative to the target {root} without '..'")
    if raw.is_absolute():
        try:
            raw = PurePosixPath(Path(path).relative_to(root).as_posix())
        except ValueError:
            raise ScopeRefused(f"{path!r} is an absolute path outside the target {root}") from None
    resolved = (root / raw).resolve()
    try:
        relative = resolved.relative_to(root).as_posix()
    except ValueError:
        raise ScopeRefused(f"{path!r} leads outside the target {root} through a symlink "
                           f"(it resolves to {resolved})") from None
    if ".git" in PurePosixPath(relative).parts or ".git" in raw.parts:
        raise ScopeRefused(f"{path!r} is inside .git; the repository's metadata is not the agent's to touch")
    return resolved, relative


def in_allowed(relative: str, allowed_paths: tuple[str, ...]) -> bool:
    """True when ``relative`` is one of the prefixes or lies below one ("allowed/" covers "allowed/x")."""
    for prefix in allowed_paths:
        stem = prefix.rstrip("/")
        if stem in ("", ".") or relative == stem or relative.startswith(stem + "/"):
            return True
    return False


def check_writable(scope: Scope, path: str) -> tuple[Path, str]:
    """Resolve ``path`` and require it under the phase's allowed paths (checked after symlinks)."""
    if not scope.allowed_paths:
        raise ScopeRefused(f"phase {scope.phase} allows no edits (its PhaseSpec.allowed_paths is empty); "
                           f"{path!r} may not be changed now")
    resolved, relative = resolve_in_target(scope.target, path)
    literal = PurePosixPath(path.replace(os.sep, "/"))
    literal_rel = relative if literal.is_absolute() else literal.as_posix()
    for name in {relative, literal_rel}:
        if not in_allowed(name, scope.allowed_paths):
            raise ScopeRefused(f"{name!r} is outside the paths phase {scope.phase} allows "
                               f"({', '.join(scope.allowed_paths)}); edit there instead")
        if in_allowed(name, scope.frozen):
            raise ScopeRefused(f"{name!r} is frozen for the whole run (its comparison logic and thresholds "
                               "must stay as at the base commit); the engine alone edits it")
    return resolved, relative


def read_text(scope: Scope, path: str, *, offset: int = 0, max_chars: int = 20_000) -> dict[str, object]:
    """A file's text from ``offset`` (at most ``max_chars``), or a directory's entries."""
    resolved, relative = resolve_in_target(scope.target, path)
    if resolved.is_dir():
        entries = sorted(p.name + ("/" if p.is_dir() else "") for p in resolved.iterdir() if p.name != ".git")
        return {"path": relative or ".", "kind": "directory", "entries": entries}
    if not resolved.is_file():
        raise ScopeRefused(f"{relative!r} does not exist in the target {scope.target}")
    text = resolved.read_text(encoding="utf-8", errors="replace")
    limit = max(1, min(max_chars, MAX_READ_CHARS))
    chunk = text[offset:offset + limit]
    following = offset + len(chunk)
    return {"path": relative, "kind": "file", "total_chars": len(text), "offset": offset, "text": chunk,
            "next_offset": following if following < len(text) else None}


def write_text(scope: Scope, path: str, content: str) -> dict[str, object]:
    """Create or replace a file under the allowed paths (parents are created)."""
    resolved, relative = check_writable(scope, path)
    if resolved.is_dir():
        raise ScopeRefused(f"{relative!r} is a directory; name a file")
    blob = content.encode("utf-8")  # before anything is touched: a bad value writes nothing
    existed = resolved.exists()
    try:
        resolved.parent.mkdir(parents=True, exist_ok=True)
        resolved.write_bytes(blob)
    except OSError as exc:
        raise _os_refused(scope, relative, exc, doing="written") from None
    return {"path": relative, "created": not existed, "chars": len(content)}


def _os_refused(scope: Scope, relative: str, exc: OSError, *, doing: str) -> ScopeRefused:
    """The OS's refusal (a parent that is a file, no permission, a full disk) as the agent's one line."""
    try:
        where = f" at {Path(exc.filename).resolve().relative_to(scope.target.resolve()).as_posix()!r}"
    except (TypeError, ValueError):  # no file name, or one outside the target: the reason alone
        where = ""
    return ScopeRefused(f"{relative!r} could not be {doing}: {exc.strerror or exc}{where}")


def replace_once(scope: Scope, path: str, old: str, new: str) -> dict[str, object]:
    """Replace the one occurrence of ``old`` in a file under the allowed paths with ``new``.

    The file is read and written as bytes decoded as UTF-8, so its line endings stay as they are.
    ``old`` must occur exactly once: no match (EditNoMatch) or several (EditNotUnique) refuse and change nothing.
    """
    resolved, relative = check_writable(scope, path)
    if not resolved.is_file():
        raise ScopeRefused(f"{relative!r} is not a file of the target; edit_file changes an existing file "
                           "(write_file creates one)")
    if not old:
        raise ScopeRefused("old_string is empty; give the exact text to replace")
    if old == new:
        raise ScopeRefused("old_string and new_string are the same; nothing would change")
    try:
        text = resolved.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise ScopeRefused(f"{relative!r} is not UTF-8 text; edit_file changes text files only") from None
    except OSError as exc:
        raise _os_refused(scope, relative, exc, doing="read") from None
    count = text.count(old)
    if count == 0:
        raise EditNoMatch(f"old_string is not in {relative!r} (0 matches; it must match exactly once), so the file "
                          "is unchanged; copy it from read_file exactly, whitespace and indentation included",
                          matches=0)
    if count > 1:
        raise EditNotUnique(f"old_string matches {count} times in {relative!r} (it must match exactly once), so "
                            "the file is unchanged; give more surrounding context: add the lines before or after "
                            "it to old_string so that it matches once", matches=count)
    at = text.index(old)
    try:
        resolved.write_bytes((text[:at] + new + text[at + len(old):]).encode("utf-8"))
    except OSError as exc:
        raise _os_refused(scope, relative, exc, doing="written") from None
    return {"path": relative, "line": text.count("\n", 0, at) + 1, "removed_chars": len(old),
            "added_chars": len(new)}


def apply_unified_diff(scope: Scope, diff: str) -> dict[str, object]:
    """Apply a unified diff with ``git apply`` after checking every path git says it would touch."""
    if not diff.strip():
        raise ScopeRefused("the diff is empty")
    if not diff.endswith("\n"):
        diff += "\n"
    paths = diff_paths(scope.target, diff)
    if not paths:
        raise ScopeRefused("git found no file changes in the diff; send a unified diff (--- a/x, +++ b/x, @@ hunks)")
    for path in paths:
        check_writable(scope, path)
    _refuse_links_and_modes(diff)
    _git_apply(scope.target, diff, "--check")
    _git_apply(scope.target, diff)
    return {"paths": paths}


def _refuse_links_and_modes(diff: str) -> None:
    """A diff may change file contents only: no symlink (mode 120000), gitlink or mode change.

    A link is checked where it lies, not where it points, so one made under an allowed path
    could lead anywhere; ``write_text`` cannot make links at all.
    """
    for line in diff.splitlines():
        if line.startswith(("new file mode ", "deleted file mode ", "old mode ", "new mode ", "index ")):
            if "120000" in line or "160000" in line:
                raise ScopeRefused("the diff creates or changes a symlink or submodule; agents may change "
                                   "file contents only")
            if line.startswith(("old mode ", "new mode ")):
                raise ScopeRefused("the diff changes a file mode; agents may change file contents only")


def _git_apply(target: Path, diff: str, *flags: str) -> str:
    try:
        return git_apply(target, diff, *flags)
    except UsageError as exc:
        raise ScopeRefused(exc.message) from None


def diff_paths(target: Path, diff: str) -> list[str]:
    try:
        return shared_diff_paths(target, diff)
    except UsageError as exc:
        raise ScopeRefused(exc.message) from None
