"""A non-editable install works outside the checkout: console entry, templates, schemas."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(ROOT)], check=True, capture_output=True)
    return site


def run_outside(site: Path, code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)


def test_cli_help_and_templates_from_the_installed_package(installed, tmp_path):
    help_text = run_outside(installed, "import sys; from orchestrator.cli import main; sys.argv=['orchestrator', "
                                       "'--help']; main()", tmp_path)
    assert help_text.returncode == 0 and "audit" in help_text.stdout, help_text.stderr
    where = run_outside(installed, "import orchestrator, phases; print(orchestrator.__file__, phases.__file__)",
                        tmp_path)
    assert str(installed) in where.stdout and str(ROOT) not in where.stdout
    rendered = run_outside(installed, (
        "from orchestrator.context import render_template as r; "
        "print(r('add_moe_model', 'commit_message.txt.j2', model_name='M', run_id='R', status='PASS', "
        "numerics_seq='numerics, seq 9', synthetic={'label': 'synthetic', 'short': 'H=1'}, real=None, kl=1e-7, "
        "max_diff=0.5, layer_kinds=[], not_clean=[]))"),
        tmp_path)
    assert rendered.returncode == 0 and "Add M to transformers MoE backend" in rendered.stdout, rendered.stderr
    lcp = run_outside(installed, (
        "from orchestrator.context import render_template as r; from orchestrator.templates_dir import templates_root; "
        "print(templates_root()); print(r('local_compile_perf', 'devlog.md.j2', run_id='R1', entries=[]))"), tmp_path)
    assert lcp.returncode == 0 and "R1" in lcp.stdout, lcp.stderr
    assert lcp.stdout.startswith(str(installed / "orchestrator" / "templates")), lcp.stdout
    assert (installed / "phases" / "kit" / "registry.json").is_file()
    shipped = installed / "orchestrator" / "templates"
    for folder in ("add_moe_model", "local_compile_perf", "agent"):
        assert list((shipped / folder).glob("*.j2")), folder
    assert not (installed / "templates").exists(), "no top-level templates package in site-packages"
    assert list((installed / "phases" / "local_compile_perf" / "embedded" / "candidates").glob("*/meta.json"))
    assert (installed / "phases" / "local_compile_perf" / "embedded" / "moe_layer" / "harness.py").is_file()
    assert not (installed / "examples").exists(), "no top-level examples package in site-packages"


def test_embedded_workspace_from_the_installed_package(installed, tmp_path):
    made = run_outside(installed, (
        "import sys; from pathlib import Path; "
        "from phases.local_compile_perf.workspace import materialize_embedded_workspace as m; "
        f"print(m(Path({str(tmp_path / 'state')!r})))"), tmp_path)
    assert made.returncode == 0, made.stderr
    workspace = Path(made.stdout.strip().splitlines()[-1])
    assert (workspace / "examples" / "moe_layer" / "harness.py").is_file()
    import git

    branches = {h.name for h in git.Repo(workspace).heads}
    assert {"main", "candidate/real-rope", "candidate/narrow-scores", "candidate/norm-rope-cat"} <= branches
