"""A warm worker: import the heavy modules once, then fork one child per worker call.

A fresh worker pays the target's imports (torch, transformers, torchtitan: ~12 s on 2
cores) on every call. ``serve`` imports them once in a process started in a target
checkout, then answers each call by ``os.fork()``: the child runs the call exactly as
``worker_main`` would, in its own process (a crash, a hang or a leak stays there), with
its stdout/stderr on a pipe the caller hands over, and with the call's target as its
working directory, first on ``sys.path`` and as the place where the packages it imported
find the submodules they have not imported yet.

A child only serves a call when every module the server imported from its own checkout is
byte-identical in the call's target (a clone of the same commit, untouched); an edited or
patched file answers "stale" and the caller runs a fresh process instead, so an agent's
edit or a temporary core patch is always what runs. The caller names the server explicitly
(``worker.Runner``); nothing is read from the environment. A child runs with the environment
the caller would give a fresh worker of the call's target (``worker.worker_env``), so both
ways apply the same setup. Standard library only.

CUDA: a child forked after its parent initialised CUDA cannot use CUDA ("Cannot re-initialize
CUDA in forked subprocess"). After each preloaded import the server forks a probe child that asks
torch whether it is in such a "bad fork" (``torch.cuda.is_initialized()`` is not enough: on an
H200 a preload initialised CUDA from C++ while it still said False); when one poisoned forks, the
server starts over (exec) without that module and those after it, so every child can use CUDA. Work that
the server must also do in each child (announcing what a setup step applied, as a fresh
worker prints it) registers with ``on_child``.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import socket
import sys
from pathlib import Path

from orchestrator import worker_main
from orchestrator.progress import pump_stream

STALE_EXIT = 75
DROPPED = "--dropped-for-cuda="
_CHILD_HOOKS: list = []


def on_child(hook) -> None:
    """Run ``hook()`` in every forked child once its output goes to the call's log."""
    _CHILD_HOOKS.append(hook)


def serve(socket_path: str, root: str, preload: list[str], dropped: str | None = None) -> None:
    """Import ``preload`` from ``root``, then fork a child for each call on ``socket_path``."""
    sys.path.insert(0, root)
    failed = []
    for index, name in enumerate(preload):
        if not _try_import(name):
            failed.append(name)
        if not fork_keeps_cuda():  # forks from here would break CUDA: start over without it
            os.execv(sys.executable, [sys.executable, "-m", "orchestrator.warm_worker", socket_path, root,
                                      DROPPED + name, *preload[:index]])
    imported = imported_files(Path(root))
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(socket_path)
    server.listen(4)
    print(json.dumps({"ready": True, "files": len(imported), "failed": failed, "dropped_for_cuda": dropped,
                      "fork_keeps_cuda": fork_keeps_cuda()}), flush=True)
    while True:
        conn, _ = server.accept()
        with conn:
            try:
                _answer_one(conn, imported, root)
            except OSError:  # the caller went away (killed, timed out): serve the next one
                pass


def fork_keeps_cuda() -> bool:
    """Whether a child forked now could use CUDA: asked in a probe child (never imports torch itself)."""
    if "torch" not in sys.modules:
        return True
    pid = os.fork()
    if pid == 0:
        cuda = getattr(sys.modules["torch"], "cuda", None)
        os._exit(1 if cuda is not None and cuda._is_in_bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def _try_import(name: str) -> bool:
    try:
        importlib.import_module(name)
    except Exception:  # noqa: BLE001 - a module that does not import is served by fresh processes
        return False
    return True


def imported_files(root: Path) -> dict[str, str]:
    """sha256 of every imported module file under ``root``, by path relative to it."""
    out = {}
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if file and Path(file).is_relative_to(root):
            out[str(Path(file).relative_to(root))] = hashlib.sha256(Path(file).read_bytes()).hexdigest()
    return out


def _answer_one(conn: socket.socket, imported: dict[str, str], root: str) -> None:
    message, fds, _, _ = socket.recv_fds(conn, 1 << 16, 1)
    call = json.loads(message)
    pid = os.fork()
    if pid == 0:
        conn.close()
        os._exit(_child(call, fds[0], imported, root))
    os.close(fds[0])
    try:
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    finally:
        _, status = os.waitpid(pid, 0)
    conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")


def _child(call: dict, log_fd: int, imported: dict[str, str], root: str) -> int:
    import signal

    os.setsid()
    # As worker_main's supervisor does: when the server (and so the engine) dies, SIGTERM
    # arrives and the child's whole group goes, grandchildren included.
    signal.signal(signal.SIGTERM, worker_main.kill_own_group)
    worker_main.die_with_parent()
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    target = Path(call["target"])
    stale = [rel for rel, digest in imported.items() if _digest(target / rel) != digest]
    if stale:
        print(f"warm worker: {len(stale)} imported file(s) differ in {target} (e.g. {stale[0]})", flush=True)
        return STALE_EXIT
    with open(call["env"], encoding="utf-8") as handle:
        os.environ.update(json.load(handle))
    for hook in _CHILD_HOOKS:
        hook()
    os.chdir(target)
    sys.path.insert(0, str(target))
    repoint_packages(root, str(target))
    try:
        return worker_main.main(call["argv"])
    except BaseException:  # noqa: BLE001 - print it like an interpreter would, then exit non-zero
        import traceback

        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def repoint_packages(root: str, target: str) -> None:
    """Packages imported from ``root`` look for their not-yet-imported submodules in ``target``."""
    prefix = root.rstrip("/") + "/"
    for module in list(sys.modules.values()):
        paths, file = getattr(module, "__path__", None), getattr(module, "__file__", None)
        if isinstance(file, str) and file.startswith(prefix) and isinstance(paths, list):
            module.__path__ = [target.rstrip("/") + "/" + p[len(prefix):] if p.startswith(prefix) else p
                               for p in paths]


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def run_warm(path: str, argv: list[str], *, target: Path, env_file: Path, timeout_s: float,
             on_progress) -> tuple[int | None, str, bytes] | None:
    """Run one call in the warm server listening on ``path``: (returncode, status, log), or None.

    ``argv`` is ``worker_main``'s (FUNC IN OUT [REQUEST ANSWER]); ``env_file`` holds a fresh worker's
    environment as JSON (a file, not the message: an environment can outgrow one read of the socket).
    None means "not served here" (server gone, or a stale file): run it fresh.
    """
    import threading
    import time

    read_fd, write_fd = os.pipe()
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(path)
        call = {"argv": argv, "target": str(target), "env": str(env_file)}
        socket.send_fds(conn, [json.dumps(call).encode()], [write_fd])
    except OSError:
        os.close(read_fd)
        return None
    finally:
        os.close(write_fd)
    log = bytearray()
    with os.fdopen(read_fd, "rb") as stream, conn:
        reader = threading.Thread(target=pump_stream, args=(stream, log, on_progress), daemon=True)
        reader.start()
        replies = conn.makefile("rb")
        pid = json.loads(replies.readline())["pid"]
        started, status = time.monotonic(), "ok"
        conn.settimeout(timeout_s)
        try:
            line = replies.readline()
        except TimeoutError:
            status, line = "timeout", b""
            os.killpg(pid, 9)
        returncode = json.loads(line)["returncode"] if line else -9
        reader.join(timeout=10)
    if returncode == STALE_EXIT:
        return None
    if status == "ok" and time.monotonic() - started > timeout_s:
        status = "timeout"
    return returncode, status, bytes(log)


if __name__ == "__main__":
    _names = sys.argv[3:]
    _dropped = _names.pop(0)[len(DROPPED):] if _names and _names[0].startswith(DROPPED) else None
    serve(sys.argv[1], sys.argv[2], _names, _dropped)
