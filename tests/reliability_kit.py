"""Helpers of the reliability suite (tests/test_reliability_*.py): real CLI processes, real git.

Each probe returns whether it *held* (the system did the right thing); the suite asserts every
probe holds, and README.md reports the counts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.conftest import ROOT


def cli_proc(*args: str, state_dir: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """The CLI as a background process in its own session (so a test can signal it alone).

    It starts with SIGINT at its default, as from a terminal: a test runner launched as a
    background job of a non-interactive shell ignores SIGINT, and a child inherits that.
    """
    return subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args, "--state-dir", str(state_dir)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            env=env, preexec_fn=_sigint_default)


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_bytes(*args: bytes | str, env: dict[str, str] | None = None, stdin: bytes = b"") -> subprocess.CompletedProcess:
    """The CLI with raw byte arguments (non-UTF-8 values reach it as the OS hands them over)."""
    command = [sys.executable.encode(), b"-m", b"orchestrator.cli"]
    command += [a if isinstance(a, bytes) else a.encode() for a in args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, timeout=120, env=env, input=stdin)


def events(state_dir: Path, run_id: str) -> list[dict[str, Any]]:
    raw = (state_dir / "runs" / run_id / "events.jsonl").read_bytes()
    return [json.loads(line) for line in raw.split(b"\n") if line.endswith(b"}")]


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for a reaper counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_for(predicate: Any, *, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.05)


def worker_pids(marker: Path) -> tuple[int, int]:
    wait_for(marker.exists)
    worker, grandchild = marker.read_text().split()
    return int(worker), int(grandchild)


def kill_group(proc: subprocess.Popen, signum: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, signum)
    except ProcessLookupError:
        pass
    proc.wait(timeout=60)


def tree_listing(path: Path) -> list[str]:
    """Every path under ``path`` (empty when it does not exist): 'nothing written' is equal listings."""
    if not path.exists():
        return []
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def one_line_error(proc: subprocess.CompletedProcess) -> bool:
    """Exit 2 with exactly one line on stderr and no traceback."""
    err = proc.stderr if isinstance(proc.stderr, str) else proc.stderr.decode("utf-8", "replace")
    return proc.returncode == 2 and err.count("\n") == 1 and "Traceback" not in err


def json_error(proc: subprocess.CompletedProcess) -> bool:
    out = proc.stdout if isinstance(proc.stdout, str) else proc.stdout.decode("utf-8", "replace")
    try:
        payload = json.loads(out)
    except ValueError:
        return False
    return proc.returncode == 2 and set(payload["error"]) == {"code", "message"} and "Traceback" not in str(proc.stderr)


def legacy_anchor_run(store: Any, run_id: str, started: Any) -> None:
    """A run as made before in-log heads: Ed25519-signed, its heads in the anchor file alone."""
    from orchestrator.trail.signing import own_signer
    from orchestrator.trail.snapshot import empty_state
    from orchestrator.trail.writer import OpenRun

    store.ensure_writable()
    run_dir = store.runs_dir / run_id
    (run_dir / "artifacts").mkdir(parents=True)
    (run_dir / "events.jsonl").touch()
    signer = own_signer(create=True)
    run = OpenRun(run_dir, empty_state(run_id), signer=signer)
    run.append(started.model_copy(update={"signer": signer}))
    run.close()
