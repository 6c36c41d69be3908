"""Phase 4 pre-check (sharding configs on a fake process group) and the forbidden-call scan."""

from __future__ import annotations

from pathlib import Path

import pytest

from phases.add_moe_model.forbidden import check_added_lines_for_forbidden_calls
from tests.conftest import call_worker

REPO = Path(__file__).resolve().parents[1]
EXP = "torchtitan/experiments/transformers_modeling_backend"

DIFF = f"""\
diff --git a/{EXP}/hf_sharding.py b/{EXP}/hf_sharding.py
--- a/{EXP}/hf_sharding.py
+++ b/{EXP}/hf_sharding.py
@@ -10,3 +10,5 @@ def f():
     keep = 1
-    old.register_forward_hook(fn)
+    layer.register_forward_pre_hook(to_dtensor)
+    parallelize_module(layer, mesh, plan)
     tail = 2
diff --git a/scripts/numerical_equivalence.py b/scripts/numerical_equivalence.py
--- a/scripts/numerical_equivalence.py
+++ b/scripts/numerical_equivalence.py
@@ -1,2 +1,3 @@
     gate.register_forward_pre_hook(cast)
+    print("no hook here")
+    h = m.register_forward_hook(log)
"""


def test_forbidden_scan_flags_added_lines_only_with_path_and_new_line_number() -> None:
    findings = check_added_lines_for_forbidden_calls(DIFF)
    assert findings == [
        f"{EXP}/hf_sharding.py:11: adds register_forward_pre_hook (shard through _sharding_config instead): "
        "layer.register_forward_pre_hook(to_dtensor)",
        f"{EXP}/hf_sharding.py:12: adds parallelize_module (shard through _sharding_config instead): "
        "parallelize_module(layer, mesh, plan)",
        "scripts/numerical_equivalence.py:3: adds register_forward_hook (shard through _sharding_config "
        "instead): h = m.register_forward_hook(log)",
    ]


def test_forbidden_scan_scope_and_clean_diff() -> None:
    assert len(check_added_lines_for_forbidden_calls(DIFF, scope=EXP)) == 2
    assert check_added_lines_for_forbidden_calls("--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n") == []


def test_parse_unsharded_reads_the_targets_error_message() -> None:
    from phases.add_moe_model.work.build_check import parse_unsharded

    message = ("Unsharded modules with no _sharding_config: ['Qwen3MoeDecoderLayer.self_attn.sinks', "
               "'Qwen3MoeDecoderLayer.foo']. Every parameter/buffer-bearing module ...")
    assert parse_unsharded(message) == ["Qwen3MoeDecoderLayer.self_attn.sinks", "Qwen3MoeDecoderLayer.foo"]
    assert parse_unsharded("something else") == []


QWEN3 = dict(model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
             num_experts=8, num_experts_per_tok=2, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
             norm_topk_prob=True, decoder_sparse_step=1, num_hidden_layers=1, vocab_size=256,
             max_position_embeddings=64, attn_implementation="sdpa", use_cache=False)
WORKER = "phases.add_moe_model.work.build_check:build_check"


@pytest.fixture(scope="session")
def qwen3_build_check() -> dict:
    return call_worker(WORKER, {"model_type": "qwen3_moe", "config_kwargs": QWEN3})


@pytest.mark.slow
def test_build_check_passes_qwen3_at_world_sizes_2_4_8(qwen3_build_check: dict) -> None:
    rows = {r["world_size"]: r for r in qwen3_build_check["results"]}
    assert sorted(rows) == [2, 4, 8]
    assert [(rows[w]["tp"], rows[w]["ep"]) for w in (2, 4, 8)] == [(1, 2), (2, 2), (2, 4)]
    for ws, row in rows.items():
        assert row["status"] == "PASS" and row["unsharded_modules"] == [], row
        assert "set_hf_sharding_configs" in row["checked"]
        assert row["parallelize"] == "PASS", row["parallelize_error"]
        # Observed: the spmd_types backend keeps local plain tensors; EP really split the
        # 8 experts (local expert dim 8 / ep).
        w1 = next(v for k, v in row["placements"].items() if k.endswith("inner_experts.w1_EFD"))
        assert w1.startswith(f"plain tensor, local shape ({8 // row['ep']},"), (ws, w1)


@pytest.mark.slow
def test_build_check_names_a_module_the_target_forgot_to_shard(tmp_path: Path) -> None:
    import shutil

    import git
    import torchtitan

    target = tmp_path / "target"
    shutil.copytree(Path(torchtitan.__path__[0]), target / "torchtitan",
                    ignore=shutil.ignore_patterns("__pycache__"))
    repo = git.Repo.init(target)
    repo.git.add(A=True)
    actor = git.Actor("test", "test@example.com")
    repo.index.commit("base", author=actor, committer=actor)
    sharding = target / EXP / "hf_sharding.py"
    text = sharding.read_text()
    assert 'if hasattr(layer, "post_attention_layernorm"):' in text
    sharding.write_text(text.replace('if hasattr(layer, "post_attention_layernorm"):', "if False:  # agent slip", 1))
    out = call_worker(WORKER, {"model_type": "qwen3_moe", "config_kwargs": QWEN3, "world_sizes": [2],
                               "parallelize": False}, target=target)
    (row,) = out["results"]
    assert out["versions"]["torchtitan_path"].startswith(str(target))
    assert row["status"] == "FAIL"
    assert row["unsharded_modules"] == ["Qwen3MoeDecoderLayer.post_attention_layernorm"]
