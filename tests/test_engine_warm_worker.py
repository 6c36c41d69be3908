"""The warm worker: one import, a forked child per call, and a fresh process when a file changed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import git
import pytest

from orchestrator.worker import Runner, run_worker, worker_env
from tests.conftest import make_repo

TOY = {"toymod.py": """
    import os
    LOADED_IN = os.getpid()

    def answer(request):
        return {"value": VALUE * request["times"], "loaded_in": LOADED_IN, "pid": os.getpid(), "cwd": os.getcwd()}

    def crash(request):
        raise RuntimeError("boom in the child")

    VALUE = 21
""", "toypkg/__init__.py": "import os\nLOADED_IN = os.getpid()\n", "toypkg/late.py": """
    import os
    import toypkg

    def answer(request):
        return {"value": 1, "loaded_in": toypkg.LOADED_IN, "pid": os.getpid()}
"""}


@pytest.fixture
def warm(tmp_path: Path):
    root = tmp_path / "root"
    make_repo(root, TOY)
    sock = str(tmp_path / "sock")
    server = subprocess.Popen([sys.executable, "-m", "orchestrator.warm_worker", sock, str(root), "toymod", "toypkg"],
                              cwd=root, env=worker_env(root), stdout=subprocess.PIPE)
    ready = json.loads(server.stdout.readline())
    try:
        yield root, server.pid, ready, Runner(warm_socket=sock)
    finally:
        server.kill()
        server.wait()


def test_calls_fork_from_the_warm_server_and_run_in_the_calls_target(warm, tmp_path):
    root, server_pid, ready, runner = warm
    assert ready["ready"] and ready["files"] == 2 and ready["failed"] == []
    clone = tmp_path / "clone"
    git.Repo.clone_from(str(root), str(clone))
    first = run_worker("toymod:answer", {"times": 2}, target=clone, runner=runner)
    second = run_worker("toymod:answer", {"times": 1}, target=clone, runner=runner)
    assert first.status == second.status == "ok"
    assert first.answer["value"] == 42 and second.answer["value"] == 21
    # imported once in the server, each call in its own forked child, working in the call's target
    assert first.answer["loaded_in"] == second.answer["loaded_in"] == server_pid
    assert len({first.answer["pid"], second.answer["pid"], server_pid}) == 3
    assert first.answer["cwd"] == str(clone)


def test_an_edited_module_is_run_fresh_so_the_edit_is_what_runs(warm, tmp_path):
    root, server_pid, _, runner = warm
    clone = tmp_path / "edited"
    git.Repo.clone_from(str(root), str(clone))
    (clone / "toymod.py").write_text((clone / "toymod.py").read_text().replace("VALUE = 21", "VALUE = 5"))
    result = run_worker("toymod:answer", {"times": 2}, target=clone, runner=runner)
    assert result.status == "ok" and result.answer["value"] == 10
    assert result.answer["loaded_in"] == result.answer["pid"] != server_pid


def test_a_crash_in_a_child_is_that_calls_failure_and_the_server_keeps_serving(warm):
    root, server_pid, _, runner = warm
    crashed = run_worker("toymod:crash", {}, target=root, runner=runner)
    assert crashed.status == "failed" and crashed.answer is None and crashed.returncode == 1
    assert b"RuntimeError: boom in the child" in crashed.log and b"FAILED toymod:crash" in crashed.log
    again = run_worker("toymod:answer", {"times": 1}, target=root, runner=runner)
    assert again.status == "ok" and again.answer["loaded_in"] == server_pid


def test_a_hung_child_times_out_and_is_killed(warm, tmp_path):
    root, _, _, runner = warm
    (root / "slow.py").write_text("import time\n\ndef sleep(request):\n    time.sleep(60)\n")
    result = run_worker("slow:sleep", {}, target=root, timeout_s=2, runner=runner)
    assert result.status == "timeout" and result.answer is None and result.seconds < 30


def test_no_server_means_a_fresh_process(tmp_path):
    root = tmp_path / "root"
    make_repo(root, TOY)
    nothing = Runner(warm_socket=str(tmp_path / "no-such-socket"))
    result = run_worker("toymod:answer", {"times": 1}, target=root, runner=nothing)
    assert result.status == "ok" and result.answer["loaded_in"] == result.answer["pid"]


def test_a_submodule_the_server_never_imported_comes_from_the_calls_target(warm, tmp_path):
    root, server_pid, _, runner = warm
    clone = tmp_path / "clone"
    git.Repo.clone_from(str(root), str(clone))
    late = clone / "toypkg" / "late.py"
    late.write_text(late.read_text().replace('"value": 1', '"value": 2'))
    result = run_worker("toypkg.late:answer", {}, target=clone, runner=runner)
    assert result.status == "ok" and result.answer["value"] == 2 and result.answer["loaded_in"] == server_pid


def test_a_preload_that_initialises_cuda_is_dropped_so_no_child_forks_after_cuda(tmp_path):
    # A forked child cannot use CUDA its parent initialised; the server starts over without the
    # module that initialised it (here one that makes a forked child's torch say "bad fork", as on a GPU).
    root = tmp_path / "root"
    make_repo(root, {**TOY, "initcuda.py": "import torch\ntorch.cuda._is_in_bad_fork = lambda: True\n"})
    sock = str(tmp_path / "sock")
    server = subprocess.Popen([sys.executable, "-m", "orchestrator.warm_worker", sock, str(root), "toymod",
                               "initcuda", "toypkg"], cwd=root, env=worker_env(root), stdout=subprocess.PIPE)
    try:
        ready = json.loads(server.stdout.readline())
        assert ready["ready"] and ready["dropped_for_cuda"] == "initcuda" and ready["fork_keeps_cuda"] is True
        result = run_worker("toymod:answer", {"times": 1}, target=root, runner=Runner(warm_socket=sock))
        assert result.status == "ok" and result.answer["loaded_in"] == server.pid != result.answer["pid"]
    finally:
        server.kill()
        server.wait()
