"""``commit_branch``: an agent without a shell turns its edits into a branch with one commit.

Only a phase that takes a submission naming a ``branch`` (local-compile-perf's candidates)
accepts it; elsewhere the edits stay in the checkout and the engine (and the person who
answers the branch and commit questions) decides what is committed. The commit is built
in a private index from HEAD plus the changed files under the phase's allowed paths, so
HEAD, the real index and the branch checked out never move. Those files are then restored
to HEAD, so the next candidate starts from a clean checkout and does not carry this one.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from orchestrator.agent.files import Scope, ScopeRefused, check_writable

AUTHOR = {"GIT_AUTHOR_NAME": "orchestrator agent", "GIT_AUTHOR_EMAIL": "agent@orchestrator.invalid",
          "GIT_COMMITTER_NAME": "orchestrator agent", "GIT_COMMITTER_EMAIL": "agent@orchestrator.invalid"}


def branch_kinds(workflow: Any, phase: str) -> list[str]:
    """The submission kinds the phase takes whose arguments name a branch, e.g. ["candidate"]."""
    return [kind for kind, row in workflow.submissions.items()
            if row.phase == phase and "branch" in row.args.model_fields]


def commit_edits(scope: Scope, *, branch: str, message: str) -> dict[str, Any]:
    """Commit the changed files under the allowed paths onto a new ``branch`` from HEAD; restore them."""
    import git

    repo = git.Repo(scope.target)
    _check_new_branch(repo, branch)
    if not message.strip():
        raise ScopeRefused("the commit message is empty; say what the change does and why")
    changed = _changed_files(repo)
    inside = [p for p in changed if _writable(scope, p)]
    left = sorted(set(changed) - set(inside))
    if not inside:
        where = f"; changed outside them: {', '.join(left)}" if left else ""
        raise ScopeRefused(f"no edits under the allowed paths ({', '.join(scope.allowed_paths)}) to commit; "
                           f"edit with edit_file, write_file or apply_diff first{where}")
    head = repo.head.commit.hexsha
    commit = _commit_in_private_index(repo, head=head, paths=inside, message=message)
    repo.git.update_ref(f"refs/heads/{branch}", commit, "0" * 40)
    _restore(repo, head=head, paths=inside)
    return {"branch": branch, "commit": commit, "parent": head, "files": inside, "left_uncommitted": left}


def _check_new_branch(repo: Any, branch: str) -> None:
    import git

    try:
        repo.git.check_ref_format("--branch", branch)
    except git.GitCommandError:
        raise ScopeRefused(f"{branch!r} is not a valid branch name") from None
    if branch.startswith(("stack/", "wip/", "rejected/")):
        raise ScopeRefused(f"{branch!r}: stack/, wip/ and rejected/ branches are the engine's; pick another name")
    if branch in {h.name for h in repo.heads}:
        raise ScopeRefused(f"branch {branch!r} already exists in {repo.working_tree_dir}; pick a new name")


def _changed_files(repo: Any) -> list[str]:
    """Files that differ from HEAD in the work tree: modified, deleted or untracked."""
    tracked = repo.git.diff("--name-only", "HEAD", "--").splitlines()
    return sorted(set(tracked) | set(repo.untracked_files))


def _writable(scope: Scope, path: str) -> bool:
    try:
        check_writable(scope, path)
    except ScopeRefused:
        return False
    return True


def _commit_in_private_index(repo: Any, *, head: str, paths: list[str], message: str) -> str:
    handle, index = tempfile.mkstemp(prefix="orchestrator-index-")
    os.close(handle)
    try:
        env = {"GIT_INDEX_FILE": index, **AUTHOR}
        repo.git.read_tree(head, env=env)
        repo.git.add("-A", "--", *paths, env=env)
        tree = repo.git.write_tree(env=env)
        return repo.git.commit_tree(tree, "-p", head, "-m", message, env=env)
    finally:
        os.unlink(index)


def _restore(repo: Any, *, head: str, paths: list[str]) -> None:
    """Put the committed files back as at HEAD: tracked ones checked out, new ones removed."""
    at_head = set(repo.git.ls_tree("-r", "--name-only", head, "--", *paths).splitlines())
    if at_head:
        repo.git.checkout(head, "--", *sorted(at_head))
    for path in sorted(set(paths) - at_head):
        os.unlink(os.path.join(repo.working_tree_dir, path))
