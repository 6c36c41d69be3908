"""Committed run evidence: one archive per folder of ``bench/results/``, unpacked for the tests that read it.

Each folder keeps its prose (the ``*.md`` files at its top: README, findings, tables) and ``evidence.tgz``,
which holds every other file the runs left there (trails and their artifacts, anchors, logs, generated job
scripts), so that grep, a reader of the tree and ``duplicates`` meet code only. An archive a run already
made (``*.tgz``) stays beside it as it is. ``tar -xzf evidence.tgz`` in the folder restores it.

``unpacked(name)`` is the folder as it was before packing, in a temporary folder (once per process):
the tests audit the trails there. ``python -m tests.evidence pack NAME...`` packs a folder's loose files
into its archive, in a fixed order with fixed times and owners, so packing twice gives the same bytes;
the packed files are then for ``git rm``.
"""

from __future__ import annotations

import atexit
import functools
import gzip
import io
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
ARCHIVE = "evidence.tgz"


@functools.cache
def unpacked(name: str) -> Path:
    """``bench/results/<name>`` with its archive unpacked beside its prose, in a folder removed at exit."""
    folder = RESULTS / name
    dest = Path(tempfile.mkdtemp(prefix=f"evidence-{name}-"))
    atexit.register(shutil.rmtree, dest, ignore_errors=True)
    with tarfile.open(folder / ARCHIVE) as tar:
        tar.extractall(dest, filter="data")
    for prose in folder.glob("*.md"):
        shutil.copy2(prose, dest / prose.name)
    return dest


def packed_files(folder: Path) -> list[Path]:
    """The files of ``folder`` that go into its archive: all but its top-level prose and archives (and caches)."""
    paths = sorted(p.relative_to(folder) for p in folder.rglob("*") if p.is_file())
    return [p for p in paths if not (len(p.parts) == 1 and p.suffix == ".md") and p.suffix != ".tgz"
            and "__pycache__" not in p.parts]


def pack(folder: Path) -> Path:
    """Write ``folder/evidence.tgz`` from ``packed_files(folder)``; the same files give the same bytes."""
    files = packed_files(folder)
    if not files or (folder / ARCHIVE).exists():
        raise SystemExit(f"{folder}: {'already packed' if files else 'no loose files'}; unpack it first "
                         f"(tar -xzf {ARCHIVE}) to add to it")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for rel in files:
            data = (folder / rel).read_bytes()
            info = tarfile.TarInfo(rel.as_posix())
            info.size, info.mtime = len(data), 0
            info.mode = 0o755 if (folder / rel).stat().st_mode & 0o100 else 0o644
            tar.addfile(info, io.BytesIO(data))
    archive = folder / ARCHIVE
    with open(archive, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as out:
        out.write(buffer.getvalue())
    return archive


if __name__ == "__main__":
    if sys.argv[1:2] != ["pack"] or not sys.argv[2:]:
        sys.exit("usage: python -m tests.evidence pack NAME...  (folders of bench/results)")
    for folder_name in sys.argv[2:]:
        print(pack(RESULTS / folder_name))
