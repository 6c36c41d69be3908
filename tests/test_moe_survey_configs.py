"""The survey's crash classes, reproduced on real transformers configs, and how each now ends.

Each case is one the issue saw end in a traceback of our own code; the assertion is the
behaviour that replaced it (a valid config, an MoE form, a refusal with a reason).
"""

from __future__ import annotations

import pytest

from phases.add_moe_model.model_source import resolve_model_source
from phases.add_moe_model.survey.discover import list_moe_models
from phases.add_moe_model.work.hf_config import build_hf_config
from phases.add_moe_model.work.config_fields import expert_count
from phases.add_moe_model.work.scaled_config import ScalePlan, build_scaled_kwargs
from phases.add_moe_model.work.synthetic import build_synthetic_entry, check_synthetic_config


def _config(model_type: str):
    return build_hf_config(resolve_model_source(f"type:{model_type}"))


@pytest.fixture(scope="module")
def discovered() -> dict[str, dict]:
    return {m["model_type"]: m for m in list_moe_models({})["models"]}


def test_moe_types_come_from_transformers_own_modeling_sources(discovered):
    import transformers

    assert {"qwen3_moe", "mixtral", "olmoe", "dbrx", "gemma4_text", "dots1", "deepseek_v3"} <= set(discovered)
    assert not {"llama", "qwen2", "youtu", "gemma3_text"} & set(discovered)
    # one row per modeling family, the text config of a multimodal family
    assert "gemma4" not in discovered and "llama4" not in discovered and "llama4_text" in discovered
    assert all(m["moe_classes"] for m in discovered.values())
    assert list_moe_models({})["transformers"] == transformers.__version__


def test_a_config_that_validates_its_per_layer_lists_gets_lists_of_its_length():
    # cohere2_moe checks len(mlp_layer_types) == num_hidden_layers: the synthetic builder
    # once predicted MoE layers on an 8-layer copy carrying a 1-entry list (ValueError).
    from transformers import AutoConfig

    real = _config("cohere2_moe")
    entry = build_synthetic_entry(real)
    assert len(entry["mlp_layer_types"]) == entry["num_hidden_layers"]
    eight = build_scaled_kwargs(real, ScalePlan(num_layers=8))
    AutoConfig.for_model(**eight)
    assert all(len(v) == 8 for k, v in eight.items() if isinstance(v, list) and k != "moe_layers")
    assert check_synthetic_config(entry, real) == []


def test_a_config_with_other_field_names_keeps_its_layers_and_real_sizes():
    # LongCat-Flash takes its sizes as ffn_hidden_size / expert_ffn_hidden_size and derives
    # num_hidden_layers as 2 * num_layers: the synthetic entry once built no layer at all.
    from transformers import AutoConfig

    from phases.add_moe_model.work.synthetic import probe_entry_build

    real = _config("longcat_flash")
    entry = build_synthetic_entry(real)
    built = AutoConfig.for_model(**entry)
    assert (built.num_layers, built.ffn_hidden_size, built.expert_ffn_hidden_size) == (1, 12288, 2048)
    assert built.n_routed_experts == 8 and built.zero_expert_num == 4  # 256 of 512 real: the same share
    assert check_synthetic_config(entry, real) == [] and probe_entry_build(entry) == ([0], [])


@pytest.mark.parametrize("model_type", ["bailing_hybrid", "flex_olmo"])
def test_the_padding_index_fits_the_shrunk_vocab(model_type):
    # Their default pad_token_id lies above vocab 256: nn.Embedding asserted in the probe's tiny model.
    from transformers import AutoConfig, AutoModelForCausalLM

    real = _config(model_type)
    assert real.pad_token_id >= 256
    kwargs = build_scaled_kwargs(real, ScalePlan(num_layers=1, tiny=True))
    assert kwargs["pad_token_id"] < kwargs["vocab_size"]
    AutoModelForCausalLM.from_config(AutoConfig.for_model(**kwargs))


@pytest.mark.parametrize("model_type, switch", [("gemma4_text", "enable_moe_block"), ("dots1", "n_routed_experts")])
def test_dense_defaults_are_surveyed_in_their_moe_form(model_type, switch):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    defaults = AutoConfig.for_model(model_type)
    assert expert_count(defaults) is None or defaults.enable_moe_block is False
    config = _config(model_type)
    assert expert_count(config) == 8 and getattr(config, switch)
    with torch.device("meta"):  # the probe's meta build; once: int * None on the unset MoE sizes
        AutoModelForCausalLM.from_config(config)


def test_a_moe_switch_named_is_moe_is_turned_on_too():
    """Doge's defaults set is_moe=False (blind trial 2 surveyed it dense: all 32 layers, a sharding finding only)."""
    from transformers import AutoConfig

    assert AutoConfig.for_model("doge").is_moe is False and _config("doge").is_moe is True


def test_experts_in_a_sub_config_count_and_a_model_without_any_does_not():
    assert expert_count(_config("dbrx")) == _config("dbrx").ffn_config.moe_num_experts > 0
    assert expert_count(_config("youtu")) is None


def test_a_layer_without_self_attn_is_described_not_crashed_on():
    import torch

    from phases.add_moe_model.work.sharding_checks import none_children_hint, check_dsa_under_tp, \
        resolve_attention_kind

    assert resolve_attention_kind(None) == "none" and check_dsa_under_tp(None) == []
    assert "no self_attn" in none_children_hint(None, torch.nn.Module())


def _log(*frames: tuple[str, int], error: str) -> str:
    body = "".join(f'  File "{f}", line {n}, in fn\n    code()\n' for f, n in frames)
    return f"@@progress {{}}\nTraceback (most recent call last):\n{body}{error}\n\nFAILED x status=failed\n"


def test_a_workers_traceback_names_who_raised_and_where_the_fix_goes():
    from orchestrator.worker import PROJECT_ROOT
    from phases.add_moe_model.survey.outcome import attribute_traceback

    ours, target, warm = f"{PROJECT_ROOT}/phases/add_moe_model/work/probe.py", "/ws/run-1", "/ws/pristine"
    lib = "/usr/lib/python3.11/site-packages/torch/nn/modules/sparse.py"
    hf = "/usr/lib/python3.11/site-packages/transformers/models/x/modeling_x.py"
    exp = f"{warm}/torchtitan/experiments/transformers_modeling_backend/moe_replacement.py"

    def attribute(*frames, error="ValueError: bad"):
        return attribute_traceback(_log(*frames, error=error), roots=(target, warm), summary="s", log="l.log")

    agent = attribute((ours, 10), (exp, 77), (lib, 5))
    assert agent["outcome"] == "needs_agent" and "moe_replacement.py:77" in agent["reasons"][0]
    human = attribute((ours, 10), (f"{target}/torchtitan/models/common/moe.py", 9))
    assert human["outcome"] == "needs_human" and "core change" in human["reasons"][0]
    unhandled = attribute((ours, 91), (hf, 300), (lib, 5), error="TypeError: int * None")
    assert unhandled["outcome"] == "error"
    assert "models/x/modeling_x.py:300" in unhandled["reasons"][0] and "probe.py:91" in unhandled["reasons"][0]
    via_target = attribute((ours, 10), (exp, 40), (hf, 300))
    assert via_target["outcome"] == "needs_agent" and "moe_replacement.py:40" in via_target["reasons"][0]
    mine = attribute((ours, 10), (exp, 77), (ours, 12), error="AttributeError: x")
    assert mine["outcome"] == "error" and "probe.py:12" in mine["reasons"][0]


def test_a_worker_killed_from_outside_is_no_verdict_on_this_machine_not_our_error():
    from phases.add_moe_model.survey.outcome import attribute_traceback

    log = "@@progress {}\n\nFAILED phases.x:y status=failed returncode=-9 after 85.7s\n"
    row = attribute_traceback(log, roots=("/t",), summary="numerics: worker failed", log="n.log")
    assert row["outcome"] == "needs_human" and "OOM" in row["reasons"][0]


def test_a_numerics_run_that_cannot_fit_in_memory_is_refused_with_the_numbers(monkeypatch):
    from phases.add_moe_model import memory_budget

    cohere = {"model_type": "cohere2_moe", "hidden_size": 8192, "intermediate_size": 22528, "num_experts": 8}
    monkeypatch.setattr(memory_budget, "available_bytes", lambda: 16 << 30)
    said = memory_budget.memory_shortfall(cohere)
    assert said and "33.0 GiB" in said and "16.0 GiB" in said
    qwen3 = {"model_type": "qwen3_moe", "hidden_size": 2048, "moe_intermediate_size": 768, "num_experts": 8}
    assert memory_budget.memory_shortfall(qwen3) is None


def test_jambas_expert_layer_period_places_its_moe_layers():
    """Blind trial 2 (jamba): 'moe_mechanism: all_layers' and layers 8..31 listed dense; its config places experts
    every expert_layer_period layers from expert_layer_offset (the class's own layers_num_experts agrees). Its
    periods cannot be rewritten to one layer per kind, so the entry keeps its first five layers, which hold its
    three kinds (Mamba x dense, Mamba x MoE, attention x dense at layer 4)."""
    from phases.add_moe_model.work.layers import predict_moe_layers, resolve_moe_mechanism
    from phases.add_moe_model.work.synthetic import probe_entry_build

    config = _config("jamba")
    assert resolve_moe_mechanism(config) == "expert_layer_period"
    assert predict_moe_layers(config) == [i for i, n in enumerate(config.layers_num_experts) if n > 1] == \
        list(range(1, 32, 2))
    entry = build_synthetic_entry(config)
    assert (entry["num_hidden_layers"], entry["attn_layer_offset"], entry["expert_layer_period"]) == (5, 4, 2)
    assert probe_entry_build(entry) == ([1, 3], [])
