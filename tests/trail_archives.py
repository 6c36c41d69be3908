"""Archived trails under bench/results: unpack one, audit it against the key packed beside it, read its runs."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

from tests.conftest import cli

RESULTS = Path(__file__).resolve().parents[1] / "bench/results"


def unpack(folder: str, into: Path) -> Path:
    """``<folder>/trails.tgz`` (state/, anchors/, signer.pub) unpacked under ``into``."""
    with tarfile.open(RESULTS / folder / "trails.tgz") as archive:
        archive.extractall(into, filter="data")
    return into


def audit_pinned(root: Path) -> subprocess.CompletedProcess:
    """``audit --all --json`` with the packed public key pinned and the packed signed heads."""
    return cli("audit", "--all", "--key", str(root / "signer.pub"), "--anchor-dir", str(root / "anchors"), "--json",
               state_dir=root / "state")


def snapshots_by_model(root: Path) -> dict[str, dict]:
    runs = [json.loads((run / "run.json").read_text()) for run in (root / "state/runs").iterdir()]
    return {s["options"]["model"]: s for s in runs}
