"""Run phase work in a fresh subprocess of the target's Python (JSON in, JSON out).

The child runs ``python -m orchestrator.worker_main FUNC IN OUT`` with the target
checkout first on ``PYTHONPATH`` and as its working directory, so the code an agent just
edited is the code that runs. stdout and stderr go to one log file (kept as an artifact by
the caller); ``@@progress`` lines from stderr are shown live. A worker that exits non-zero,
times out, or leaves no answer file raises ``WorkerFailed`` and its log ends with a
``FAILED`` marker line so nobody mistakes an earlier result for this run's. When a warm
worker is in use (``use_warm_server``, e.g. during a survey) the call is forked from it
instead, with the same contract; it answers "not here" when a file it imported differs in the target,
and the call then runs in a fresh process as above.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from orchestrator import warm_worker
from orchestrator.errors import WorkerFailed
from orchestrator.progress import pump_stream
from orchestrator.worker_main import die_with_parent

PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)
_WARM_SERVER: list[str] = []
"""The socket of the warm server calls are forked from (empty: every call runs fresh)."""


class use_warm_server:  # noqa: N801 - a context manager, named for what the block does
    """Within the block, ``run_worker`` forks its calls from the warm server on ``socket_path``."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path

    def __enter__(self) -> "use_warm_server":
        _WARM_SERVER.append(self.socket_path)
        return self

    def __exit__(self, *exc: Any) -> None:
        _WARM_SERVER.remove(self.socket_path)


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerRun:
    """How one worker call ended."""

    answer: dict[str, Any] | None
    status: str
    """ok, failed or timeout."""
    returncode: int | None
    seconds: float
    log: bytes


def worker_env(target: Path, extra_paths: tuple[str, ...] = ()) -> dict[str, str]:
    """Environment of a worker: target first on PYTHONPATH, then this project."""
    env = dict(os.environ)
    paths = [str(target), *extra_paths, PROJECT_ROOT]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    env["ORCHESTRATOR_ENGINE_PID"] = str(os.getpid())
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    return env


def run_worker(
    func: str,
    request: dict[str, Any],
    *,
    target: Path,
    python: str = sys.executable,
    timeout_s: float = 900.0,
    on_progress: Callable[[str], None] | None = None,
) -> WorkerRun:
    """Run ``func(request)`` in a fresh process; never raises for the child's failures."""
    with tempfile.TemporaryDirectory(prefix="orchestrator-worker-") as tmp:
        request_path, answer_path = Path(tmp, "request.json"), Path(tmp, "answer.json")
        request_path.write_text(json.dumps(request))
        started = time.monotonic()
        if python == sys.executable and _WARM_SERVER:
            warm = warm_worker.run_warm(_WARM_SERVER[-1], func, request_path, answer_path, target=target,
                                        timeout_s=timeout_s, on_progress=on_progress)
            if warm is not None:
                return _finish(func, warm, answer_path=answer_path, seconds=time.monotonic() - started)
        command = [python, "-m", "orchestrator.worker_main", func, str(request_path), str(answer_path)]
        try:
            child = subprocess.Popen(
                command, cwd=target, env=worker_env(target), stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent,
            )
        except OSError as exc:
            return WorkerRun(answer=None, status="failed", returncode=None, seconds=0.0,
                             log=f"FAILED {func}: cannot start {python!r} in {target}: {exc.strerror}\n".encode())
        log = bytearray()
        reader = threading.Thread(target=pump_stream, args=(child.stdout, log, on_progress), daemon=True)
        reader.start()
        status = "ok"
        try:
            child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            status = "timeout"
            _kill_worker_group(child)
        except BaseException:  # Ctrl-C, SIGTERM: the worker and everything it started go too
            _kill_worker_group(child)
            raise
        reader.join(timeout=10)
        return _finish(func, (child.returncode, status, bytes(log)), answer_path=answer_path,
                       seconds=time.monotonic() - started)


def _finish(func: str, ended: tuple[int | None, str, bytes], *, answer_path: Path, seconds: float) -> WorkerRun:
    returncode, status, log = ended
    answer = _read_answer(answer_path) if status == "ok" and returncode == 0 else None
    if status == "ok" and answer is None:
        status = "failed"
    if status != "ok":
        log += f"\nFAILED {func} status={status} returncode={returncode} after {seconds:.1f}s\n".encode()
    return WorkerRun(answer=answer, status=status, returncode=returncode, seconds=seconds, log=log)


def _kill_worker_group(child: subprocess.Popen) -> None:
    """SIGKILL the worker's process group (its own session: the worker and all it started)."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    child.wait()


def _read_answer(path: Path) -> dict[str, Any] | None:
    try:
        answer = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return answer if isinstance(answer, dict) else {"value": answer}


def failure(func: str, run: WorkerRun, *, log_name: str) -> WorkerFailed:
    """The error to raise for a failed run, quoting the end of its log."""
    tail = run.log.decode("utf-8", "replace").strip().splitlines()[-12:]
    return WorkerFailed(
        f"worker {func} {run.status} (exit {run.returncode}) after {run.seconds:.1f}s; "
        f"log: artifacts/{log_name}; last lines:\n" + "\n".join(tail),
        log=log_name, status=run.status,
    )
