"""Input files a run is given (``--model path/config.json``, ``--weights DIR``, ...): hashed and kept at start.

A start option whose value names an existing file or directory (a value with a path separator, or one
that starts with "~" or ".", or ends in ".json") is an input. Each of its files is recorded in the run's
``run_started`` (``inputs``): the options that name it, its path (relative to the state dir when it lies
inside it, else absolute, as ``RunStore.record_path`` writes it), its size and its sha256; a file up to
``MAX_KEPT`` bytes is also kept as the artifact ``inputs/<option>/<name>``, so a copied state dir holds
what the run read. What was not done is said in the entry's ``note`` (a file over ``MAX_HASHED`` is not
hashed; a directory's files past ``MAX_FILES`` are counted, not listed). The target is not an input:
``run_started.target`` records it.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

MAX_HASHED = 1 << 30
MAX_KEPT = 1 << 20
MAX_FILES = 1000
NOT_INPUTS = ("target",)
_SKIPPED_DIRS = {".git", "__pycache__"}


def record_inputs(options: dict[str, Any], *, record_path: Any) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
    """(the ``inputs`` entries, artifact name -> bytes of the copies to keep) for ``options``.

    ``record_path``: how a path is written in the trail (``RunStore.record_path``).
    """
    entries: dict[Path, dict[str, Any]] = {}
    partial: list[dict[str, Any]] = []
    copies: dict[str, bytes] = {}
    for key, value in options.items():
        root = _named_path(key, value)
        if root is None:
            continue
        files, left = _files_of(root)
        for path, name in files:
            if path in entries:
                entries[path]["options"].append(key)
                continue
            entries[path] = _entry(key, path, name, record_path=record_path, copies=copies)
        if left:
            partial.append({"options": [key], "path": record_path(root), "bytes": None, "sha256": None,
                            "artifact": None, "note": f"{left} more file(s) in this directory are not recorded "
                                                      f"(only the first {MAX_FILES})"})
    return list(entries.values()) + partial, copies


def _named_path(key: str, value: Any) -> Path | None:
    if key in NOT_INPUTS or not isinstance(value, str) or not value:
        return None
    if not (os.sep in value or value.startswith(("~", ".")) or value.endswith(".json")):
        return None
    path = Path(value).expanduser()
    return path.resolve() if path.exists() else None


def _files_of(root: Path) -> tuple[list[tuple[Path, str]], int]:
    """(file, its name under inputs/<option>/) pairs of an input, and how many files were left out."""
    if root.is_file():
        return [(root, root.name)], 0
    found = sorted(p for p in root.rglob("*") if p.is_file() and not _SKIPPED_DIRS & set(p.relative_to(root).parts))
    named = [(p, f"{root.name}/{p.relative_to(root).as_posix()}") for p in found[:MAX_FILES]]
    return named, max(0, len(found) - MAX_FILES)


def _entry(key: str, path: Path, name: str, *, record_path: Any, copies: dict[str, bytes]) -> dict[str, Any]:
    size = path.stat().st_size
    entry: dict[str, Any] = {"options": [key], "path": record_path(path), "bytes": size, "sha256": None,
                             "artifact": None, "note": ""}
    if size > MAX_HASHED:
        entry["note"] = f"not hashed: larger than {MAX_HASHED >> 20} MiB"
        return entry
    if size <= MAX_KEPT:
        blob = path.read_bytes()
        entry["sha256"] = hashlib.sha256(blob).hexdigest()
        entry["artifact"] = f"inputs/{key}/{name}"
        copies[entry["artifact"]] = blob
        return entry
    entry["sha256"] = _sha256_of_file(path)
    entry["note"] = f"not kept in the state dir: larger than {MAX_KEPT >> 20} MiB"
    return entry


def _sha256_of_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def keep_copies(run: Any, copies: dict[str, bytes]) -> None:
    """Write the kept input files as artifacts of the open run, each recorded (``artifact_written``)."""
    from orchestrator.trail import events as ev

    for name, blob in copies.items():
        name, sha, size = run.write_artifact_file(name, blob)
        run.append(ev.ArtifactWritten(name=name, sha256=sha, bytes=size))
