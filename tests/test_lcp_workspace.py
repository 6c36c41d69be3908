"""The embedded workspace: a real git repo with main + one commit per candidate branch."""

from __future__ import annotations

import json
import shutil

import git
import pytest

from phases.local_compile_perf import workspace
from phases.local_compile_perf.workspace import (
    WorkspaceError,
    compute_content_hash,
    describe_workspace,
    load_candidates,
    materialize_embedded_workspace,
)


@pytest.fixture
def made(tmp_path):
    return materialize_embedded_workspace(tmp_path / "state")


def test_workspace_layout_and_branches(made, tmp_path):
    assert made.parent == tmp_path / "state" / "workspaces"
    assert made.name == f"moe-layer-{compute_content_hash()}"
    repo = git.Repo(made)
    assert repo.active_branch.name == "main" and not repo.is_dirty(untracked_files=True)
    assert (made / "examples" / "moe_layer" / "local_compile.py").is_file()
    branches = {c.meta.branch for c in load_candidates()}
    assert {"candidate/real-rope", "candidate/narrow-scores", "candidate/norm-rope-cat"} <= branches
    assert set(describe_workspace(made)) == branches | {"main"}


def test_each_candidate_is_one_commit_touching_its_files(made):
    """The branch tip is the candidate's diff alone, on main plus the candidates it is written on."""
    repo = git.Repo(made)
    main = repo.heads.main.commit
    for candidate in load_candidates():
        tip = repo.heads[candidate.meta.branch].commit
        (parent,) = tip.parents
        under = repo.git.rev_list(f"{main.hexsha}..{parent.hexsha}").split()
        assert len(under) == len(candidate.meta.after), candidate.name
        changed = sorted(d.a_path for d in parent.diff(tip))
        assert changed == sorted(candidate.meta.files), candidate.name
        shown = repo.git.diff(parent.hexsha, tip.hexsha, "--", *candidate.meta.files)
        added = [line for line in shown.splitlines() if line.startswith("+") and not line.startswith("+++")]
        wanted = [line for line in candidate.diff.read_text().splitlines()
                  if line.startswith("+") and not line.startswith("+++")]
        assert added and added == wanted, candidate.name


def test_a_rewrite_written_on_others_holds_them_first(made):
    repo = git.Repo(made)
    (rope,) = [c for c in load_candidates() if c.name == "rope-in-place"]
    subjects = repo.git.log("--format=%s", f"main..{rope.meta.branch}").splitlines()[::-1]
    firsts = [repo.heads[f"candidate/{dep}"].commit.message.splitlines()[0] for dep in rope.meta.after]
    assert subjects[:-1] == firsts and len(subjects) == len(rope.meta.after) + 1


def test_after_must_name_a_candidate_and_must_not_loop(tmp_path):
    for name, after in (("a", ["b"]), ("b", ["a"])):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "change.diff").write_text("--- a/examples/x.py\n+++ b/examples/x.py\n")
        (folder / "meta.json").write_text(json.dumps({
            "label": name, "pattern": None, "branch": f"candidate/{name}", "regions": [],
            "files": ["examples/x.py"], "message": name, "after": after}))
    with pytest.raises(WorkspaceError, match="loops back"):
        load_candidates(tmp_path)
    (tmp_path / "b" / "meta.json").write_text((tmp_path / "b" / "meta.json").read_text().replace('["a"]', '["zz"]'))
    with pytest.raises(WorkspaceError, match="unknown candidate"):
        load_candidates(tmp_path)


def test_materialize_is_idempotent_and_restores_missing_branches(made, tmp_path):
    before = describe_workspace(made)
    assert materialize_embedded_workspace(tmp_path / "state") == made
    assert describe_workspace(made) == before
    repo = git.Repo(made)
    repo.delete_head("candidate/real-rope", force=True)
    materialize_embedded_workspace(tmp_path / "state")
    after = describe_workspace(made)
    assert set(after) == set(before) and after["main"] == before["main"]


def test_dirty_workspace_is_refused(made, tmp_path):
    (made / "examples" / "moe_layer" / "rope.py").write_text("# edited\n")
    with pytest.raises(WorkspaceError, match="rope.py"):
        materialize_embedded_workspace(tmp_path / "state")


def test_content_hash_follows_candidates(tmp_path):
    copy = tmp_path / "candidates"
    shutil.copytree(workspace.CANDIDATES_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    base = compute_content_hash(candidates_root=copy)
    assert base == compute_content_hash()
    meta = copy / "real-rope" / "meta.json"
    meta.write_text(meta.read_text().replace("RoPE in real arithmetic", "RoPE, real"))
    assert compute_content_hash(candidates_root=copy) != base


def test_bad_candidate_is_reported(tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "meta.json").write_text(
        '{"label": "x", "pattern": 1, "branch": "candidate/x", "regions": [], '
        '"files": ["examples/moe_layer/nope.py"], "message": "x"}'
    )
    with pytest.raises(WorkspaceError, match="nope.py"):
        load_candidates(tmp_path)
