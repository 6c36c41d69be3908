"""Provenance attached to every measurement, by one helper and not by each function.

A number without its device, library versions, target commit, seed and command cannot be
audited or compared, so the kit's callers (measure_once, worker functions, phases) attach
``collect_provenance(...)`` to what they return. Versions are read from package metadata
(importing transformers only to ask its version would cost seconds); the target commit
comes from ``git rev-parse HEAD`` in the target, with a flag when its tree is dirty.
"""

from __future__ import annotations

import datetime as dt
import platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Sequence

from pydantic import BaseModel, ConfigDict


class Provenance(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    command: str
    seed: int
    device_name: str
    torch: str
    triton: str
    transformers: str
    torchtitan: str
    cuda: str
    target: str
    target_commit: str
    target_dirty: bool | None
    hostname: str
    python: str
    recorded_at: str


def probe_version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def probe_device_name() -> str:
    """CUDA device name, or the host CPU model labelled as such."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.cuda.current_device())
    return f"cpu: {_cpu_model()}"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def probe_git_commit(target: Path) -> tuple[str, bool | None]:
    """(HEAD commit, dirty) of ``target``; ("not a git checkout: ...", None) otherwise."""
    try:
        head = _git(target, "rev-parse", "HEAD")
        dirty = bool(_git(target, "status", "--porcelain", "--untracked-files=no"))
    except (subprocess.CalledProcessError, OSError) as err:
        return f"not a git checkout: {target} ({type(err).__name__})", None
    return head, dirty


def _git(target: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(target), *args], capture_output=True, text=True,
                          check=True, timeout=30).stdout.strip()


def collect_provenance(*, command: str | Sequence[str], seed: int, target: Path) -> dict:
    """Everything needed to trust or reproduce a measurement, as JSON-able fields.

    Args:
        command: the command line (or argv) that produced the measurement.
        seed: the seed used for weights and inputs.
        target: the target checkout measured.

    Returns:
        ``Provenance`` dumped to a dict (for ``ctx.record_measurement(provenance=...)``).
    """
    import torch

    commit, dirty = probe_git_commit(Path(target))
    return Provenance(
        command=command if isinstance(command, str) else " ".join(command),
        seed=seed,
        device_name=probe_device_name(),
        torch=torch.__version__,
        triton=probe_version("triton"),
        transformers=probe_version("transformers"),
        torchtitan=probe_version("torchtitan"),
        cuda=torch.version.cuda or "none (CPU build of torch)",
        target=str(Path(target).resolve()),
        target_commit=commit,
        target_dirty=dirty,
        hostname=socket.gethostname(),
        python=platform.python_version(),
        recorded_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    ).model_dump(mode="json")
