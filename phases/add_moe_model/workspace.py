"""The embedded target: a git workspace made from the installed torchtitan package.

``--target embedded`` needs nothing but the installed wheel. A pristine repository is made
once per torchtitan version and content (``<state>/workspaces/.pristine-torchtitan-<v>-<hash>``:
the package copied without caches, one commit by the bot: ``orchestrator.workspaces``), and every
run gets its own ``git clone`` of it, so runs never edit each other's tree and the base commit is the
same for all.
No torch import: the package is located with ``importlib.util.find_spec``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import secrets
import shutil
from pathlib import Path

from orchestrator.errors import UsageError
from orchestrator.workspaces import build_pristine, set_bot_identity

EXP = "torchtitan/experiments/transformers_modeling_backend/"
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so")


def installed_torchtitan() -> tuple[Path, str]:
    """Directory and version of the installed torchtitan package (not imported)."""
    spec = importlib.util.find_spec("torchtitan")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("torchtitan is not installed: `pip install torchtitan==0.3.0`, "
                         "or pass --target PATH to a torchtitan checkout")
    version = importlib.metadata.version("torchtitan")
    return Path(next(iter(spec.submodule_search_locations))), version


def content_hash(package: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def pristine_repo(state_dir: Path) -> Path:
    """The pristine repository for the installed torchtitan (made once, atomically)."""
    package, version = installed_torchtitan()

    def copy_package(folder: Path) -> str:
        shutil.copytree(package, folder / "torchtitan", ignore=_IGNORE)
        return f"torchtitan {version} as installed (pristine)"

    return build_pristine(state_dir / "workspaces" / f".pristine-torchtitan-{version}-{content_hash(package)}",
                          copy_package)


def new_run_workspace(state_dir: Path) -> Path:
    """A fresh clone of the pristine repository for one run (caller removes it on failure)."""
    import git

    pristine = pristine_repo(state_dir)
    version = pristine.name.split("-")[2]
    target = state_dir / "workspaces" / f"torchtitan-{version}-{secrets.token_hex(3)}"
    set_bot_identity(git.Repo.clone_from(str(pristine), str(target), local=True))
    return target
