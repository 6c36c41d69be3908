"""Shared fixtures: an isolated environment, real git repos, and a CLI runner.

Every test runs with NO_COLOR, COLUMNS=80, an isolated global git config and its own
state dir, so output is deterministic and nothing leaks from the developer's machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytest_plugins = ["tests.run_fixtures", "tests.slurm_kit"]
TOY = "toy=tests.toyflow:WORKFLOW"


# CI runs the suite on two pytest-xdist workers (.ci/run: -n 2 --no-loadscope-reorder, so units go in the
# order below rather than by their number of tests). A test module is one unit of work, so its module and session
# fixtures are built once; modules that share a session fixture costing minutes form one unit (the real runs of
# tests/run_fixtures.py; the SLURM cluster and its two fake GPUs). xdist's own --dist loadgroup cannot say this
# under pytest 9 (it renames node ids through an attribute pytest 9 no longer reads), so the scheduler is ours.
SHARED_UNITS = {
    "real_runs": ("test_matrix_cpu", "test_moe_workflow", "test_moe_main_tree", "test_moe_survey"),
    "slurm": ("test_slurm_cluster", "test_slurm_jobs", "test_slurm_parallelism", "test_slurm_restart",
              "test_slurm_survey", "test_slurm_timeout", "test_slurm_sacct", "test_slurm_job_files"),
}
UNIT_OF_MODULE = {module: unit for unit, modules in SHARED_UNITS.items() for module in modules}


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its module's shared unit, or its module."""
    module = nodeid.split("::", 1)[0]
    return UNIT_OF_MODULE.get(Path(module).stem, module)


# Units that take minutes go first, so that neither worker starts one near the end (longest first).
LONGEST_FIRST = ("real_runs", "tests/test_lcp_workflow_e2e.py", "slurm", "tests/test_moe_numerics.py",
                 "tests/test_moe_probe.py", "tests/test_moe_synthetic.py", "tests/test_moe_pretrained.py",
                 "tests/test_moe_gap_cpu.py", "tests/test_moe_gap_recipes.py", "tests/test_agent_fix_offer.py",
                 "tests/test_agent_moe_fix.py", "tests/test_moe_fixability_numerics.py",
                 "tests/test_moe_layer_kinds.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {unit: i for i, unit in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(unit_of(item.nodeid), len(rank)))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class ModuleUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return ModuleUnits(config, log)


@pytest.fixture(autouse=True, scope="session")
def isolation(tmp_path_factory: pytest.TempPathFactory) -> None:
    home = tmp_path_factory.mktemp("home")
    gitconfig = home / ".gitconfig"
    gitconfig.write_text("[user]\n\tname = Test\n\temail = test@example.com\n[init]\n\tdefaultBranch = main\n")
    for key in [k for k in os.environ if k.startswith("GIT_")]:
        del os.environ[key]
    os.environ.update(
        NO_COLOR="1", COLUMNS="80", GIT_CONFIG_GLOBAL=str(gitconfig), GIT_CONFIG_NOSYSTEM="1",
        ORCHESTRATOR_WORKFLOWS=TOY, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
        ORCHESTRATOR_ANCHOR_DIR=str(home / "anchors"),
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    os.environ.pop("ORCHESTRATOR_STATE_DIR", None)
    os.environ.pop("ANTHROPIC_API_KEY", None)


def make_repo(path: Path, files: dict[str, str], *, message: str = "init") -> Any:
    """A real git repository at ``path`` holding ``files`` (dedented), committed once."""
    import git

    path.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        file = path / name
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(textwrap.dedent(text))
    repo = git.Repo.init(path, initial_branch="main")
    repo.git.add(A=True)
    repo.index.commit(message)
    return repo


@pytest.fixture
def toy_repo(tmp_path: Path) -> Path:
    target = tmp_path / "target"
    make_repo(target, {"a.txt": "hello\n", "allowed/README": "edit here\n"})
    return target


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


def cli(*args: str, state_dir: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (the way users and agents run it)."""
    command = [sys.executable, "-m", "orchestrator.cli", *args]
    if state_dir is not None:
        command += ["--state-dir", str(state_dir)]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.fixture
def invoke():
    """In-process CLI (click's CliRunner) for fast tests; exceptions propagate."""
    from click.testing import CliRunner

    from orchestrator.cli import main

    runner = CliRunner()

    def run(*args: str) -> Any:
        return runner.invoke(main, list(args), catch_exceptions=False)

    return run


def call_worker(func: str, request: dict, *, target: Path = ROOT, timeout_s: float = 900,
                on_progress: Callable[[str], None] | None = None) -> dict:
    """Run a worker function exactly as phases do (the engine's run_worker); fail with its log."""
    from orchestrator.worker import run_worker

    result = run_worker(func, request, target=target, timeout_s=timeout_s, on_progress=on_progress)
    assert result.answer is not None, result.log.decode("utf-8", "replace")[-3000:]
    return result.answer


def call_handle(worker: Any, request: Any, *, target: Path = ROOT, timeout_s: float = 900) -> Any:
    """``ctx.call(worker, request)`` without a run: both sides validated, the answer model returned."""
    from orchestrator.worker import run_worker

    body = worker.request.model_validate(request).model_dump(mode="json")
    result = run_worker(worker.ref, body, target=target, timeout_s=timeout_s, models=worker.models())
    assert result.answer is not None, result.log.decode("utf-8", "replace")[-3000:]
    return worker.answer.model_validate(result.answer)


@pytest.fixture(scope="session")
def embedded_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded target as a workflow sees it: a git workspace with ``examples/moe_layer`` (shared, read only)."""
    from phases.local_compile_perf.workspace import materialize_embedded_workspace

    return materialize_embedded_workspace(tmp_path_factory.mktemp("embedded-state"))


MAIN_TARBALL = "torchtitan-main-b5bcd76c6.tar.gz"


def shared_targets() -> Path | None:
    """``shared/targets`` beside the repository (CI), else the machine's /work/shared/targets."""
    for folder in (ROOT.parent / "shared" / "targets", Path("/work/shared/targets")):
        if (folder / MAIN_TARBALL).is_file():
            return folder
    return None


def service_missing(service: str, reason: str) -> None:
    """A service a test needs is not there: the test fails where CI provides it (``ORCHESTRATOR_CI_SERVICES``, set
    by .ci/run), else it skips with ``reason``. CI never passes without the tests its services are for."""
    if service in os.environ.get("ORCHESTRATOR_CI_SERVICES", "").split():
        pytest.fail(f"CI provides {service}, but: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def main_snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The torchtitan main snapshot extracted once per session as a one-commit git repo (clone it to edit)."""
    import tarfile

    import git

    folder = shared_targets()
    if folder is None:
        pytest.skip(f"no {MAIN_TARBALL} in ../shared/targets or /work/shared/targets")
    dest = tmp_path_factory.mktemp("main-snapshot")
    with tarfile.open(folder / MAIN_TARBALL) as tar:
        tar.extractall(dest, filter="data")
    root = next(dest.iterdir())
    repo = git.Repo.init(root, initial_branch="main")
    repo.git.add(A=True)
    repo.index.commit("torchtitan main b5bcd76c6 (snapshot)")
    return root


def clone_of(source: Path, dest: Path) -> Path:
    """A fresh clone with a committer identity (runs commit into it)."""
    import git

    from orchestrator.workspaces import set_bot_identity

    set_bot_identity(git.Repo.clone_from(str(source), str(dest)))
    return dest


def write_tiny_checkpoint(folder: Path) -> Path:
    """A real HF checkpoint (config.json + model.safetensors) of a qwen3_moe at tiny dims, via save_pretrained."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    config = Qwen3MoeConfig(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_experts=4,
                            num_experts_per_tok=2, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=16, vocab_size=256, max_position_embeddings=64)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny qwen3_moe checkpoint for the pretrained tests (``--weights``), written once per session."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("weights") / "tiny-qwen3-moe")
