"""Entry point of a worker subprocess: ``python -m orchestrator.worker_main FUNC IN OUT [REQUEST ANSWER]``.

Imports ``FUNC`` ("pkg.mod:fn") from the worker's sys.path (the target checkout first),
calls it with the JSON request read from IN, and writes the JSON answer to OUT. With the
models of a ``phase_api.Worker`` handle ("pkg.mod:Class" each), the request is validated into
REQUEST before the call (the function gets the model) and the answer into ANSWER before it
is written, so a malformed answer fails here, in the worker's log. The answer file appears
only when the function returned (atomic rename), so a worker that dies leaves no answer and
the engine records it as FAILED. Standard library only (pydantic only for a typed call).

The process the engine starts is a small supervisor (the leader of the worker's own process
group): it forks the child that does the work and waits. When the engine dies, even by
SIGKILL, the kernel sends the supervisor SIGTERM (PR_SET_PDEATHSIG, set by the engine), and
the supervisor SIGKILLs the whole group, so no child or grandchild keeps working.
"""

from __future__ import annotations

import importlib
import json
import os
import sys


def main(argv: list[str]) -> int:
    func_ref, request_path, answer_path, *models = argv
    with open(request_path, encoding="utf-8") as handle:
        request = json.load(handle)
    answer = call_function(func_ref, request, models=tuple(models))
    tmp = answer_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(answer, handle, allow_nan=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, answer_path)
    return 0


def call_function(func_ref: str, request: object, *, models: tuple[str, ...] = ()) -> object:
    """``FUNC(request)`` as JSON-able data; with ``models`` (request, answer) both sides are validated."""
    func = resolve(func_ref)
    if models:
        request = resolve(models[0]).model_validate(request)
    answer = func(request)
    if models:  # NOTE: resolved after the call, which may first move into another checkout (run_in_checkout)
        answer = resolve(models[1]).model_validate(answer)
    if hasattr(answer, "model_dump"):
        answer = answer.model_dump(mode="json")
    return answer


def resolve(ref: str) -> object:
    """The object named by "pkg.mod:attr"."""
    module_name, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def supervise() -> None:
    """Fork; the parent stays behind as the group's supervisor and exits as its child did."""
    import signal

    signal.signal(signal.SIGTERM, kill_own_group)
    expected_parent = os.environ.get("ORCHESTRATOR_ENGINE_PID")
    if expected_parent and os.getppid() != int(expected_parent):
        kill_own_group()  # the engine died before the death signal was armed
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        set_death_signal(signal.SIGKILL)
        if os.getppid() == 1:
            os._exit(1)
        return
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):  # die the same way, so the engine sees the child's signal
        signum = os.WTERMSIG(status)
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    os._exit(os.waitstatus_to_exitcode(status))


def kill_own_group(*_args: object) -> None:
    """SIGKILL this process's whole group (a signal handler: it takes and ignores the handler's arguments)."""
    import signal

    os.killpg(os.getpgrp(), signal.SIGKILL)


def die_with_parent() -> None:
    """Linux: this process gets SIGTERM when its parent dies (even by SIGKILL); a worker's supervisor
    then kills the worker's whole process group, grandchildren included. A ``preexec_fn``."""
    import signal

    set_death_signal(signal.SIGTERM)


def set_death_signal(signum: int) -> None:
    """Linux: ``signum`` arrives when the parent process dies (PR_SET_PDEATHSIG); elsewhere nothing."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signum)  # PR_SET_PDEATHSIG
    except OSError:
        pass


if __name__ == "__main__":
    if os.getpgrp() == os.getpid():  # started by the engine in its own session
        supervise()
    sys.exit(main(sys.argv[1:]))
