"""``status`` without click (cli_base.run_plain_status): the same output and exit code as click's, and a lean start."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from orchestrator.cli_base import plain_status_args
from tests.conftest import ROOT, cli

CLICK_ONLY = "import sys; sys.argv = ['orchestrator'] + sys.argv[1:]; from orchestrator.cli import main; main()"
LEAN = ("import atexit, sys; atexit.register(lambda: print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'click', 'cryptography', 'nacl', 'pydantic', 'transitions', 'rich', 'hashlib', 'filelock', 'git', "
        "'jinja2'}) + "
        "sorted(m for m in sys.modules if m.startswith(('orchestrator.trail.anchor', 'orchestrator.trail.signing', "
        "'orchestrator.trail.writer', 'orchestrator.workflow', 'orchestrator.jobs', 'phases'))), file=sys.stderr)); "
        "sys.argv = ['orchestrator'] + sys.argv[1:]; from orchestrator.console import entry; entry()")


def via_click(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CLICK_ONLY, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=60)


@pytest.mark.parametrize("argv, expected", [
    (["status", "R", "--json"], {"run_id": "R", "as_json": True}),
    (["status", "--state-dir=D", "--debug"], {"state_dir": "D", "debug": True}),
    (["status", "--state-dir", "D", "R"], {"state_dir": "D", "run_id": "R"}),
    (["status"], {}),
    (["status", "R", "S"], None), (["status", "--json", "--json"], None), (["status", "-h"], None),
    (["status", "--help"], None), (["status", "--jso"], None), (["status", "--json=1"], None),
    (["status", "--state-dir"], None), (["status", "--state-dir", "--json"], None), (["status", "--state-dir="], None),
    (["status", "--"], None), (["status", ""], None), (["status", "-"], None), (["status", "R\udcff"], None),
    (["list"], None), (["show", "R"], None), ([], None),
])
def test_only_a_plainly_spelled_status_skips_click(argv, expected):
    assert plain_status_args(argv) == expected


def test_plain_status_prints_what_click_prints(toy_repo, state_dir):
    run_id = json.loads(cli("start", "toy", "--target", str(toy_repo), "--json", state_dir=state_dir).stdout)["run_id"]
    cli("advance", run_id, state_dir=state_dir)
    sd = str(state_dir)
    for args in (["status", run_id, "--json", "--state-dir", sd], ["status", "--state-dir=" + sd, run_id],
                 ["status", "--json", "--state-dir", sd], ["status", "--state-dir", sd],
                 ["status", "no-such-run", "--json", "--state-dir", sd], ["status", "../x", "--state-dir", sd]):
        fast, slow = cli(*args), via_click(*args)
        assert (fast.returncode, fast.stdout, fast.stderr) == (slow.returncode, slow.stdout, slow.stderr), args
    debug = ["status", run_id, "--debug", "--state-dir", str(state_dir / "missing")]
    fast, slow = cli(*debug), via_click(*debug)  # the traceback's frames differ (no click frames), not its end
    assert fast.returncode == slow.returncode == 2 and fast.stderr.startswith("Traceback")
    assert fast.stderr.splitlines()[-3:] == slow.stderr.splitlines()[-3:]
    assert cli("status", run_id, "--json", state_dir=state_dir).returncode == 3  # waiting for a human


def test_plain_status_imports_no_click_no_key_no_workflow(toy_repo, state_dir):
    run_id = json.loads(cli("start", "toy", "--target", str(toy_repo), "--json", state_dir=state_dir).stdout)["run_id"]
    proc = subprocess.run([sys.executable, "-c", LEAN, "status", run_id, "--json", "--state-dir", str(state_dir)],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0 and json.loads(proc.stdout)["run_id"] == run_id, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "[]", proc.stderr
