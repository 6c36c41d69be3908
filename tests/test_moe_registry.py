"""add_moe_model MODEL resolution: the bundled registry, config files, type:, hub ids."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from phases.add_moe_model.model_source import ModelSourceError, resolve_model_source
from phases.kit.registry import find_registry_entry, load_registry

ROOT = Path(__file__).resolve().parent.parent
REQUIRED = [
    "Qwen/Qwen3-30B-A3B", "mistralai/Mixtral-8x7B-v0.1", "deepseek-ai/DeepSeek-V3", "allenai/OLMoE-1B-7B-0924",
    "deepseek-ai/DeepSeek-V2-Lite", "zai-org/GLM-4.5-Air", "openai/gpt-oss-20b", "Qwen/Qwen1.5-MoE-A2.7B",
    "meta-llama/Llama-4-Scout-17B-16E", "ibm-granite/granite-3.0-3b-a800m-base", "google/gemma-4-26B-A4B",
]


def test_registry_holds_required_models_with_unique_names() -> None:
    entries = load_registry()
    assert sorted(e.hf_id for e in entries) == sorted(REQUIRED)
    names = [n.lower() for e in entries for n in (e.hf_id, *e.aliases)]
    assert len(names) == len(set(names))
    for entry in entries:
        assert entry.config["hidden_size"] > 0 and entry.config["num_hidden_layers"] > 0, entry.hf_id
        assert entry.provenance


def test_registry_id_and_alias_resolve_case_insensitively() -> None:
    by_id = resolve_model_source("deepseek-ai/DeepSeek-V3")
    assert (by_id.kind, by_id.model_type, by_id.config["n_routed_experts"]) == ("registry", "deepseek_v3", 256)
    assert resolve_model_source("  QWEN3-30B-A3B ").model_id == "Qwen/Qwen3-30B-A3B"
    assert find_registry_entry("gemma4_text").config["hidden_size"] == 2816


def test_type_prefix_gives_model_type_source() -> None:
    source = resolve_model_source("type:olmoe")
    assert (source.kind, source.model_type, source.config) == ("model_type", "olmoe", {})
    with pytest.raises(ModelSourceError, match="not a transformers model_type"):
        resolve_model_source("type:Bad Name")


def test_config_file_and_directory(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mixtral", "hidden_size": 64}))
    for text in (str(tmp_path), str(tmp_path / "config.json")):
        source = resolve_model_source(text)
        assert (source.kind, source.model_type, source.config["hidden_size"]) == ("config_file", "mixtral", 64)
        assert source.path == str((tmp_path / "config.json").resolve())


@pytest.mark.parametrize(
    ("content", "match"),
    [(None, "config file not found"), ("{not json", "not valid JSON"), ('{"hidden_size": 1}', "no string 'model_type'"),
     ("[1]", "no string 'model_type'")],
)
def test_bad_config_files_are_rejected(tmp_path: Path, content: str | None, match: str) -> None:
    file = tmp_path / "model" / "config.json"
    if content is not None:
        file.parent.mkdir()
        file.write_text(content)
    with pytest.raises(ModelSourceError, match=match):
        resolve_model_source(str(file))


def test_unknown_hub_id_is_left_to_the_worker_and_garbage_is_rejected() -> None:
    source = resolve_model_source("someorg/SomeMoE-1B")
    assert (source.kind, source.model_type) == ("hub", None)
    for text in ("", "   ", "not a model id"):
        with pytest.raises(ModelSourceError):
            resolve_model_source(text)


def test_engine_side_modules_do_not_import_torch() -> None:
    code = (
        "import sys, phases.add_moe_model.probe, phases.add_moe_model.synthetic_config, "
        "phases.add_moe_model.config_entry;"
        "print(sorted(m for m in ('torch', 'transformers', 'torchtitan') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_every_registry_entry_builds_its_transformers_config() -> None:
    from phases.add_moe_model.work.config_fields import EXPERT_COUNT_KEYS as EXPERT_KEYS
    from phases.add_moe_model.work.config_fields import read_field
    from phases.add_moe_model.work.hf_config import build_hf_config

    for entry in load_registry():
        config = build_hf_config(resolve_model_source(entry.hf_id))
        assert config.model_type == entry.model_type
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads"):
            assert read_field(config, key) == entry.config[key], (entry.hf_id, key)
        experts = [entry.config[k] for k in EXPERT_KEYS if k in entry.config]
        assert experts and any(read_field(config, k) == experts[0] for k in EXPERT_KEYS), entry.hf_id


@pytest.mark.slow
def test_hub_id_not_in_registry_fails_offline_with_a_clear_message() -> None:
    from phases.add_moe_model.work.hf_config import HFConfigError, build_hf_config

    with pytest.raises(HFConfigError, match="not reachable offline; pass a config.json"):
        build_hf_config(resolve_model_source("someorg/SomeMoE-1B"))
