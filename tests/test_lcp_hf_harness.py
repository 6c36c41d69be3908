"""hf:<model_type> harness: registry dims, layer kinds, seeded workload, trap checks."""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from phases.kit.harness import load_harness  # noqa: E402
from phases.local_compile_perf.start import hf_harness_ref  # noqa: E402
from phases.local_compile_perf.work.hf_harness import parse_hf_ref, read_registry_dims, shrink_config  # noqa: E402
from phases.local_compile_perf.work.traps import check_harness_traps  # noqa: E402


def torchtitan_root() -> Path:
    """A tree holding only the installed torchtitan package (site-packages holds much else,
    e.g. this project's own ``examples`` once it is pip-installed, as in CI)."""
    spec = importlib.util.find_spec("torchtitan")
    assert spec is not None and spec.origin is not None
    root = Path(tempfile.mkdtemp(prefix="tt-tree-"))
    (root / "torchtitan").symlink_to(Path(spec.origin).parent, target_is_directory=True)
    return root


@pytest.fixture(scope="session")
def qwen3():
    return load_harness(hf_harness_ref("hf:qwen3_moe"))


def test_registry_dims_and_aliases():
    dims = read_registry_dims("qwen3_moe")
    assert (dims["hidden_size"], dims["moe_intermediate_size"], dims["num_experts"]) == (2048, 768, 128)
    assert read_registry_dims("qwen3-30b-a3b") == dims
    with pytest.raises(ValueError, match="known: .*qwen3_moe"):
        read_registry_dims("no_such_model")


def test_shrink_keeps_gqa_ratio():
    small = shrink_config(read_registry_dims("qwen3_moe"))
    assert small["hidden_size"] == 256 and small["num_experts"] == 8
    assert small["num_attention_heads"] // small["num_key_value_heads"] == 32 // 4
    assert small["num_hidden_layers"] == 48  # layer ids stay valid


def test_qwen3_workload_and_traps(qwen3):
    assert qwen3.spec.name == "hf:qwen3_moe-small"  # CPU default scale
    assert qwen3.spec.all_regions == () and qwen3.spec.layer_kinds == ("moe",)
    workload = qwen3.build(tokens=32, device="cpu", dtype=torch.bfloat16, seed=0)
    (hidden,) = workload.inputs
    assert hidden.shape == (1, 32, 256) and hidden.is_leaf and hidden.requires_grad
    cos, _ = workload.position_embeddings
    assert cos.shape[-2] == 32
    assert torch.equal(workload.step(), workload.step())
    findings = check_harness_traps(qwen3, tokens=32, device="cpu", target=torchtitan_root())
    assert all(f.status == "pass" for f in findings), [f.message for f in findings if f.status == "fail"]
    with pytest.raises(ValueError, match="declares no compile regions"):
        qwen3.bind_regions(["router"])


def test_deepseek_v3_covers_dense_and_moe():
    harness = load_harness(hf_harness_ref("hf:deepseek_v3"))
    assert harness.spec.layer_kinds == ("dense", "moe")
    assert harness.layer_ids[0] < 3 <= harness.layer_ids[1]  # first_k_dense_replace = 3
    workload = harness.build(tokens=16, device="cpu", dtype=torch.bfloat16, seed=0)
    kinds = [type(layer.mlp).__name__ for layer in workload.layers]
    assert kinds == ["DeepseekV3MLP", "DeepseekV3MoE"]
    loss = workload.step()
    assert torch.isfinite(loss) and workload.inputs[0].grad is not None


def test_kernel_options_reach_the_config_and_the_spec_name():
    assert parse_hf_ref("qwen3_moe") == ("qwen3_moe", {"attn": "sdpa", "experts": "grouped_mm"})
    with pytest.raises(ValueError, match="not attn=IMPL or experts=IMPL"):
        parse_hf_ref("qwen3_moe,attention=eager")
    harness = load_harness(hf_harness_ref("hf:qwen3_moe,attn=eager"))
    assert harness.spec.name == "hf:qwen3_moe-small[attn=eager]"
    assert (harness.config._attn_implementation, harness.config._experts_implementation) == ("eager", "grouped_mm")
