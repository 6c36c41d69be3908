"""One fresh process of a confirmation, watching the GPU for intruders.

Each run is a new process of ``command`` (typically a measurement script)
that prints one ``RESULT {json}`` line on success. Only that run's own output is parsed: a
run that exits non-zero or prints no RESULT is a FAILED row, so a crash can never reuse an
earlier run's result. While a run is alive, ``nvidia-smi --query-compute-apps`` is polled
(when the tool exists); any compute process on the measured GPU (the first visible one) that
is not the run or one of its children is recorded on the row, which is then contaminated and
should be rerun. Work on the host's other GPUs is not an intruder. Stdlib only: this
module runs in the engine process too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Mapping, Sequence

from phases.kit.records import RunOutcome

RESULT_PREFIX = "RESULT "
POLL_INTERVAL_S = 0.5


def parse_result(output: str) -> dict | None:
    """The JSON of the last ``RESULT {json}`` line of one run's output, or None."""
    for line in reversed(output.splitlines()):
        if line.startswith(RESULT_PREFIX):
            try:
                return json.loads(line[len(RESULT_PREFIX):])
            except ValueError:
                return None
    return None


def probe_gpu_pids() -> set[int] | None:
    """PIDs of compute processes on the measured GPU, or None when nvidia-smi is absent or fails."""
    apps = _nvidia_smi("--query-compute-apps=pid,gpu_uuid")
    if apps is None:
        return None
    measured = measured_gpu_uuid()
    return {int(row[0]) for row in apps if row[0].isdigit() and (measured is None or row[-1] == measured)}


def measured_gpu_uuid() -> str | None:
    """UUID of the GPU a run's ``cuda`` device is: the first of CUDA_VISIBLE_DEVICES, else index 0.

    None when it cannot be told (then every GPU's processes count).
    """
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    if first.startswith(("GPU-", "MIG-")):
        return first
    gpus = _nvidia_smi("--query-gpu=index,uuid")
    return next((row[1] for row in gpus or [] if len(row) == 2 and row[0] == first), None)


def _nvidia_smi(query: str) -> list[list[str]] | None:
    """Rows of one ``nvidia-smi`` CSV query (cells stripped), or None when it cannot run."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", query, "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    return [[cell.strip() for cell in line.split(",")] for line in out.splitlines() if line.strip()]


def _descendants(pid: int) -> set[int]:
    """``pid`` and every process below it, from /proc (Linux)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    family, grew = {pid}, True
    while grew:
        new = {child for child, parent in parents.items() if parent in family} - family
        family |= new
        grew = bool(new)
    return family


def machine_id() -> str:
    """This boot of this machine and the GPU a run measures on: what a result read back after a cut must share."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "no boot id"
    return f"boot {boot}, gpu {measured_gpu_uuid() or 'none'}"


def host_load() -> float:
    """The host's 1-minute load average now (-1 where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return -1.0


def run_once(
    command: Sequence[str], *, index: int, env: Mapping[str, str] | None, poll_gpu: bool, timeout_s: float
) -> RunOutcome:
    """One fresh process; RESULT parsed from its own output only."""
    foreign: set[int] = set()
    load = host_load()
    with tempfile.TemporaryFile(mode="w+") as log:
        proc = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, **(env or {})})
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None:
            if poll_gpu and (pids := probe_gpu_pids()):
                foreign |= pids - _descendants(proc.pid)
            if time.monotonic() > deadline:
                proc.kill()
            time.sleep(POLL_INTERVAL_S)
            load = max(load, host_load())
        log.seek(0)
        output = log.read()
    result = parse_result(output) if proc.returncode == 0 else None
    return RunOutcome(
        index=index,
        status="ok" if result is not None else "FAILED",
        result=result,
        returncode=proc.returncode,
        foreign_pids=tuple(sorted(foreign)),
        host_load=load if load >= 0 else None,
        log_tail=output[-2000:],
    )
