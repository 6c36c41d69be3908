"""Every edit recorded whole: an auditor rebuilds the tracked paths at any seq from the trail and the base commit.

Issue 39: an agent's apply_diff kept the first 200 characters, the size and a sha256 of its diff; the
visible part named one file while another changed too. Here an agent edits through every writing tool
(a file created, one edited three times, one deleted, a long diff over two files), a person edits the
workspace directly between calls, and the engine records each change. The rebuild below reads
events.jsonl and the artifacts with plain json and git, as state/README.md tells an auditor to.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

from orchestrator.trail.store import RunStore
from tests.conftest import cli
from tests.test_agent_tools import Caller, agent_env, run_to_fix  # noqa: F401 (agent_env is a fixture)

LONG = "".join(f"line {n}: the body of a long module the agent rewrites\n" for n in range(60))


def git(repo: Path, *args: str, stdin: bytes | None = None) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], input=stdin, capture_output=True, check=True)
    return done.stdout.decode()


def blobs_under(repo: Path, folder: str = "allowed") -> dict[str, str]:
    """Path -> git blob id of every file under ``folder`` as the working tree has it."""
    files = sorted(p for p in (repo / folder).rglob("*") if p.is_file())
    return {p.relative_to(repo).as_posix(): git(repo, "hash-object", str(p)).strip() for p in files}


def long_two_file_diff(target: Path) -> str:
    """A diff far over 2000 characters: rewrites allowed/a.py, and only after that deletes allowed/README."""
    a_lines = (target / "allowed" / "a.py").read_text().splitlines(True)
    readme = (target / "allowed" / "README").read_text()
    body = "".join(f"-{line}" for line in a_lines) + "".join(f"+{line}" for line in LONG.splitlines(True))
    return (f"--- a/allowed/a.py\n+++ b/allowed/a.py\n@@ -1,{len(a_lines)} +1,60 @@\n{body}"
            f"diff --git a/allowed/README b/allowed/README\ndeleted file mode 100644\n--- a/allowed/README\n"
            f"+++ /dev/null\n@@ -1 +0,0 @@\n-{readme}")


def test_the_trail_and_the_base_commit_rebuild_the_folder_at_every_seq(agent_env: None, toy_repo: Path,
                                                                       tmp_path: Path) -> None:
    store = RunStore(tmp_path / "state")
    caller = Caller(store)
    run_id = run_to_fix(caller, toy_repo)
    seen: list[tuple[int, dict[str, str]]] = []

    def step(tool: str, by_hand: dict[str, str] | None = None, **arguments: Any) -> None:
        for path, text in (by_hand or {}).items():  # a person (or an agent's own Edit tool) edits the workspace
            (toy_repo / path).write_text(text)
        result = caller(tool, run_id=run_id, **arguments)
        assert result.status == "ok", result.message
        seen.append((store.read_state(run_id)["last_seq"], blobs_under(toy_repo)))

    step("write_file", path="allowed/a.py", content="print('a')\n")
    step("edit_file", path="allowed/README", old_string="edit here", new_string="edited here")
    step("apply_diff", diff=long_two_file_diff(toy_repo))
    step("advance", by_hand={"allowed/c.txt": "by hand\n", "allowed/a.py": LONG + "# and a line by hand\n"})
    step("edit_file", path="allowed/a.py", old_string="# and a line by hand", new_string="# by the agent")
    assert caller("write_file", run_id=run_id, path="a.txt", content="outside\n").status == "refused"
    step("write_file", path="allowed/sub/fixed.txt", content="not the one the phase wants\n")
    step("write_file", path="allowed/fixed.txt", content="done\n")
    step("advance")
    assert store.read_state(run_id)["status"] == "done"

    rebuild_and_compare(store.run_dir(run_id), toy_repo, seen)
    from orchestrator.edits import edits_in  # what show and audit list per edit

    edits = edits_in(store.read_events(run_id))
    assert [(e["by"], e["tool"]) for e in edits] == [
        ("tool", "write_file"), ("tool", "edit_file"), ("tool", "apply_diff"), ("outside", None),
        ("tool", "edit_file"), ("tool", "write_file"), ("tool", "write_file")]
    assert [{f["path"]: f["change"] for f in e["files"]} for e in edits][2:4] == [
        {"allowed/a.py": "modified", "allowed/README": "deleted"},
        {"allowed/a.py": "modified", "allowed/c.txt": "added"}]
    assert all(e["call_id"] for e in edits if e["by"] == "tool")
    [acted] = [e["data"] for e in store.read_events(run_id) if e["type"] == "agent_acted" and e["data"]["tool"] ==
               "apply_diff"]
    assert "README" not in acted["arguments"]["diff"]["head"]  # the call's record keeps a head, its edit all files
    audit = cli("audit", run_id, "--schema", "--json", state_dir=store.state_dir)
    assert audit.returncode == 0 and json.loads(audit.stdout)["ok"], audit.stdout


def rebuild_and_compare(run_dir: Path, target: Path, seen: list[tuple[int, dict[str, str]]]) -> None:
    """The auditor's rebuild: the base commit, then each recorded diff in seq order, with plain git."""
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    hashes = {e["data"]["name"]: e["data"]["sha256"] for e in events if e["type"] == "artifact_written"}
    rebuilt = run_dir.parent.parent / "rebuilt"
    git(target.parent, "clone", "-q", "--no-checkout", str(target), str(rebuilt))
    git(rebuilt, "checkout", "-q", events[0]["data"]["base"]["commit"])
    edits = [e for e in events if e["type"] == "edit_recorded"]
    for seq, observed in seen:
        for edit in [e for e in edits if e["seq"] <= seq]:
            edits.remove(edit)
            diff = (run_dir / "artifacts" / edit["data"]["diff"]).read_bytes()
            assert hashlib.sha256(diff).hexdigest() == hashes[edit["data"]["diff"]]
            before = blobs_under(rebuilt)
            git(rebuilt, "apply", "--binary", "-", stdin=diff)
            after = blobs_under(rebuilt)
            assert {p: {"before": before.get(p), "after": after.get(p)} for p in before.keys() | after.keys()
                    if before.get(p) != after.get(p)} == edit["data"]["files"], edit["seq"]
        assert blobs_under(rebuilt) == observed, seq
    assert edits == []


def test_a_ref_lock_a_killed_command_left_does_not_stop_the_next_record(agent_env: None, toy_repo: Path,
                                                                       tmp_path: Path) -> None:
    store, caller, run_id = written_once(toy_repo, tmp_path)
    lock = toy_repo / ".git" / "refs" / "orchestrator" / "edits" / f"{run_id}.lock"
    lock.write_text("a killed update-ref's\n")
    written = caller("write_file", run_id=run_id, path="allowed/a.txt", content="two\n")
    assert written.status == "ok", written.message
    recorded = [e["data"]["tree_after"] for e in store.read_events(run_id) if e["type"] == "edit_recorded"]
    assert len(recorded) == 2 and git(toy_repo, "rev-parse", f"refs/orchestrator/edits/{run_id}").strip() == \
        recorded[-1] and not lock.exists()


def test_an_abort_records_the_edits_made_since_the_last_record(agent_env: None, toy_repo: Path,
                                                               tmp_path: Path) -> None:
    store, caller, run_id = written_once(toy_repo, tmp_path)
    (toy_repo / "allowed" / "a.txt").write_text("two, by hand\n")
    aborted = cli("abort", run_id, "--reason", "giving up on this model", state_dir=store.state_dir)
    assert aborted.returncode == 0, aborted.stderr
    events = store.read_events(run_id)
    assert events[-1]["type"] == "run_aborted"
    [edit] = [e["data"] for e in events if e["type"] == "edit_recorded" and e["data"]["by"] == "outside"]
    assert list(edit["files"]) == ["allowed/a.txt"]
    blob = git(toy_repo, "hash-object", str(toy_repo / "allowed" / "a.txt")).strip()
    assert edit["files"]["allowed/a.txt"]["after"] == blob


def written_once(toy_repo: Path, tmp_path: Path) -> tuple[RunStore, Caller, str]:
    """A toy run waiting for the agent, with allowed/a.txt written once through the tools."""
    store = RunStore(tmp_path / "state")
    caller = Caller(store)
    run_id = run_to_fix(caller, toy_repo)
    assert caller("write_file", run_id=run_id, path="allowed/a.txt", content="one\n").status == "ok"
    return store, caller, run_id
