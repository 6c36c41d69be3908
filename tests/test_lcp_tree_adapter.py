"""Tree adapter: region API generation, regions, override kernels, fp32 precision (pure text)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from phases.local_compile_perf.tree_adapter import (
    probe_tree,
    resolve_package_dir,
    resolve_target_fp32_precision,
)

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def installed_torchtitan_root() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("torchtitan")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent.parent


def test_installed_torchtitan_has_no_region_api():
    inventory = probe_tree(installed_torchtitan_root())
    assert inventory.region_api == "none"
    assert "no local_compile API (torchtitan 0.3.0)" in inventory.region_api_message
    assert "torchtitan/distributed/local_compile.py" in inventory.region_api_message
    assert inventory.regions == ()
    assert {"fused_mla", "fused_swiglu"} <= {hit.value for hit in inventory.override_kernels}
    # 0.3.0 only turns TF32 off in batch-invariant mode: no fp32_precision setting.
    assert inventory.resolved_fp32_precision == "ieee"


def test_newer_main_tree_lists_regions_and_precision(tmp_path):
    tree = write_tree(tmp_path, {
        "torchtitan/__init__.py": "",
        "torchtitan/distributed/local_compile.py": "def apply_local_compile(regions): ...\n",
        "torchtitan/models/dsv3/model.py": """
            '''Regions are declared with ``@local_compile("name")``.'''
            # @local_compile("commented_out")
            HELP = 'use @local_compile("in_a_string")'
            @local_compile("router", batch_invariant=True)
            def route(x): ...
            @local_compile(
                "mla_qk", options={"max_pointwise_cat_inputs": 0})
            def qk(x): ...
            """,
        "torchtitan/models/dsv3/config.py": "local_compile_regions = ['router']\n",
        "torchtitan/trainer.py": "torch.backends.cuda.matmul.fp32_precision = 'tf32'\n",
        "torchtitan_recipes/overrides/fused_mla.py": "",
    })
    inventory = probe_tree(tree)
    assert inventory.region_api == "config_regions"
    # Read from the syntax: the docstring, the comment and the string declare nothing; a call
    # spread over two lines does.
    assert [(h.value, h.path, h.line) for h in inventory.regions] == [
        ("router", "torchtitan/models/dsv3/model.py", 5), ("mla_qk", "torchtitan/models/dsv3/model.py", 7)]
    assert inventory.resolved_fp32_precision == "tf32"
    assert [h.value for h in inventory.override_kernels] == ["fused_mla"]


def test_embedded_plan_lists_only_the_decorated_regions(embedded_workspace):
    """A new user's plan listed a region `name` at local_compile.py:3: its docstring."""
    from phases.local_compile_perf.plan import probe_inventory

    inventory = probe_inventory(embedded_workspace, kind="embedded")
    assert inventory["regions"] == [
        "swiglu (examples/moe_layer/experts.py:55)", "rms_norm (examples/moe_layer/norm.py:11)",
        "rope (examples/moe_layer/rope.py:21)", "router (examples/moe_layer/router.py:17)"]
    assert '@local_compile("name")' in (embedded_workspace / "examples/moe_layer/local_compile.py").read_text()


def test_older_tree_and_conflicting_precision(tmp_path):
    tree = write_tree(tmp_path, {
        "torchtitan/__init__.py": "",
        "torchtitan/distributed/local_compile.py": "class LocalCompileConfig: ...\n",
        "torchtitan/trainer.py": 'torch.backends.cuda.matmul.fp32_precision = "tf32"\n',
        "torchtitan/experiments/x/train.py": 'torch.backends.cuda.matmul.fp32_precision = "ieee"\n',
    })
    inventory = probe_tree(tree)
    assert inventory.region_api == "local_compile_config"
    assert inventory.resolved_fp32_precision is None
    precision, source = resolve_target_fp32_precision(tree)
    assert precision is None and "trainer.py" in source and "train.py" in source


def test_embedded_library_declares_its_precision(embedded_workspace):
    precision, source = resolve_target_fp32_precision(embedded_workspace)
    assert precision == "tf32"
    assert "trainer_settings.py" in source


def test_not_a_tree_names_the_path(tmp_path):
    with pytest.raises(ValueError, match=str(tmp_path)):
        resolve_package_dir(tmp_path)


def test_engine_side_modules_import_no_torch():
    code = (
        "import sys\n"
        "import phases.kit.harness, phases.local_compile_perf.workspace, "
        "phases.local_compile_perf.tree_adapter\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_findings_list_a_trees_own_fused_overrides_as_not_tested():
    """The plan's inventory of a real tree (torchtitan 0.3.0 has fused_mla, fused_swiglu) reaches "Not tested"."""
    from phases.local_compile_perf.findings import NOT_TESTED_HOST, not_tested

    overrides = tuple(hit.value for hit in probe_tree(installed_torchtitan_root()).override_kernels)
    listed = not_tested(None, ({"tokens": 16},), overrides, cuda=False)
    assert listed[:3] == NOT_TESTED_HOST and len(listed) == 4
    assert listed[3].startswith("the target's own fused overrides (") and "fused_mla" in listed[3]
