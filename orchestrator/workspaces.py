"""Git workspaces the workflows make, and the identity every commit they make carries.

A workflow's embedded target is a git repository made from files this project ships or finds installed
(add-moe-model: the installed torchtitan package; local-compile-perf: the embedded MoE layer library and
its candidate branches). ``build_pristine`` makes such a repository once per content (the caller names
the folder after a hash of what goes in): it is built in a temporary folder beside it and renamed into
place, so a crash never leaves a half-made one and two processes racing to make it both get the one that
won. Its commits, and every other commit a workflow makes, are the bot's (``BOT_NAME``, ``BOT_EMAIL``),
so no git identity is needed on the host. GitPython is imported inside the functions.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

BOT_NAME = "orchestrator"
BOT_EMAIL = "orchestrator@localhost"
GITIGNORE = "__pycache__/\n*.pyc\n"


def bot() -> Any:
    """The bot as a GitPython ``Actor`` (author and committer)."""
    import git

    return git.Actor(BOT_NAME, BOT_EMAIL)


def commit_as_bot(repo: Any, message: str, **kwargs: Any) -> Any:
    """Commit the index of ``repo`` with the bot as author and committer (``kwargs`` go to ``index.commit``)."""
    return repo.index.commit(message, author=bot(), committer=bot(), **kwargs)


def set_bot_identity(repo: Any) -> None:
    """Make the bot the repository's own ``user``, so commits made through the git CLI are the bot's too."""
    with repo.config_writer() as config:
        config.set_value("user", "name", BOT_NAME)
        config.set_value("user", "email", BOT_EMAIL)


def build_pristine(path: Path, populate: Callable[[Path], str], *,
                   on_top: Callable[[Any], None] | None = None) -> Path:
    """The git repository at ``path``, built once: an existing ``path`` is returned as it is (the caller
    checks it).

    ``populate(folder)`` writes the files and returns the first commit's message; the commit holds them
    all but caches (``GITIGNORE``), on ``main``. ``on_top(repo)`` adds what goes on that commit (branches)
    before the rename.
    """
    import git

    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".new-{path.name}-"))
    try:
        message = populate(tmp)
        (tmp / ".gitignore").write_text(GITIGNORE)
        repo = git.Repo.init(tmp, initial_branch="main")
        repo.git.add(A=True)
        commit_as_bot(repo, message)
        if on_top is not None:
            on_top(repo)
        os.replace(tmp, path)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (isinstance(exc, OSError) and (path / ".git").is_dir()):  # lost a race: the winner's is as good
            raise
    return path
