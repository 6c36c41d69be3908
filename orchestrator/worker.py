"""Run phase work in a fresh subprocess of the target's Python (JSON in, JSON out).

The child runs ``python -m orchestrator.worker_main FUNC IN OUT`` with the target
checkout first on ``PYTHONPATH`` and as its working directory, so the code an agent just
edited is the code that runs. stdout and stderr go to one log file (kept as an artifact by
the caller); ``@@progress`` lines from stderr are shown live. A worker that exits non-zero,
times out, or leaves no answer file raises ``WorkerFailed`` and its log ends with a
``FAILED`` marker line so nobody mistakes an earlier result for this run's. Which process
runs a call is the caller's ``Runner``, passed down explicitly (the engine's context holds
one): fresh by default, or forked from a warm server (a survey's), with the same contract
and the same environment (``worker_env`` of the call's target); the warm server answers
"not here" when a file it imported differs in the target, and the call then runs fresh.
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
from orchestrator.progress import Line, pump_stream
from orchestrator.worker_main import die_with_parent

PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)


@dataclass(frozen=True, kw_only=True, slots=True)
class Runner:
    """Which process runs a worker call.

    Attributes:
        warm_socket: socket of a warm server (``orchestrator.warm_worker``) to fork calls from;
            "" runs every call in a fresh process. A call for another Python than this one's,
            or one the server answers "not here", runs fresh either way.
    """

    warm_socket: str = ""


FRESH = Runner()


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
    on_progress: Callable[[Line], None] | None = None,
    models: tuple[str, ...] = (),
    runner: Runner = FRESH,
) -> WorkerRun:
    """Run ``func(request)`` in a worker process; never raises for the child's failures.

    ``models``: "module:Class" of the request and answer models (``phase_api.Worker.models``),
    validated in the worker; empty for an untyped call.
    """
    with tempfile.TemporaryDirectory(prefix="orchestrator-worker-") as tmp:
        request_path, answer_path = Path(tmp, "request.json"), Path(tmp, "answer.json")
        request_path.write_text(json.dumps(request))
        started, env = time.monotonic(), worker_env(target)
        if python == sys.executable and runner.warm_socket:
            env_file = Path(tmp, "env.json")
            env_file.write_text(json.dumps(env))
            warm = warm_worker.run_warm(runner.warm_socket, [func, str(request_path), str(answer_path), *models],
                                        target=target, env_file=env_file, timeout_s=timeout_s,
                                        on_progress=on_progress)
            if warm is not None:
                return _finish(func, warm, answer_path=answer_path, seconds=time.monotonic() - started)
        command = [python, "-m", "orchestrator.worker_main", func, str(request_path), str(answer_path), *models]
        try:
            child = subprocess.Popen(
                command, cwd=target, env=env, stdout=subprocess.PIPE,
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
