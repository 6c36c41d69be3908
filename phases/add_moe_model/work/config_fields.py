"""Reading a transformers config's fields, and the names config classes give the expert count and top-k.

Torch-free, and transformers only inside ``config_init_keys``, so engine-side phases and workers
share it. One key list each for every reader (preflight, the synthetic rules, the scaled configs,
the memory budget, the commit message): ``moe_num_experts``/``moe_topk`` are aria_text's, ``moe_k``
ernie4_5_moe's, ``moe_top_k`` dbrx's ffn_config.
"""

from __future__ import annotations

import inspect
from typing import Any

EXPERT_COUNT_KEYS = ("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts")
TOP_K_KEYS = ("num_experts_per_tok", "top_k_experts", "experts_per_token", "moe_top_k", "moe_topk", "moe_k")


def read_field(config: Any, key: str) -> Any:
    """Return ``config.<key>`` or None; per-layer (heterogeneous) fields also read as None."""
    try:
        return getattr(config, key, None)
    except RuntimeError:  # transformers' AmbiguousGlobalPerLayerAttributeError (Gemma4)
        return None


def read_first_layer_field(config: Any, key: str) -> Any:
    """``config.<key>``, or layer 0's value where the config varies it per layer."""
    value = read_field(config, key)
    layers = getattr(config, "per_layer_config", None) if value is None else None
    return read_field(layers[0], key) if layers else value


def config_init_keys(model_type: str) -> frozenset[str]:
    """Return the keyword names the config class of ``model_type`` accepts."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return frozenset(inspect.signature(CONFIG_MAPPING[model_type].__init__).parameters)


def init_key(config: Any, key: str, keys: frozenset[str]) -> str | None:
    """The keyword under which the config class takes ``key``: itself, or the field its ``attribute_map``
    names (LongCat-Flash takes intermediate_size as ffn_hidden_size); None: the class takes neither."""
    if key in keys:
        return key
    alias = getattr(type(config), "attribute_map", {}).get(key)
    return alias if alias in keys else None


def layer_count_key(keys: frozenset[str]) -> str:
    """The field that sets how many decoder layers the model builds: ``num_hidden_layers``, or ``num_layers``
    where the class derives num_hidden_layers from it (LongCat-Flash: two attention sublayers per layer, so
    num_hidden_layers=1 builds none)."""
    return "num_layers" if "num_hidden_layers" not in keys and "num_layers" in keys else "num_hidden_layers"


def resolve_config_key(keys: frozenset[str], candidates: tuple[str, ...]) -> str | None:
    """Return the first candidate the config class reads, or None."""
    return next((k for k in candidates if k in keys), None)


def expert_count(config: Any) -> int | None:
    """The routed-expert count of ``config`` or of one of its sub-configs (dbrx's ffn_config)."""
    for holder in (config, *_sub_configs(config)):
        for key in EXPERT_COUNT_KEYS:
            value = read_field(holder, key)
            if isinstance(value, int) and value > 0:
                return value
    return None


def entry_expert_count(entry: dict[str, Any]) -> int | None:
    """The expert count a config entry (``AutoConfig.for_model`` kwargs) sets; None: it keeps the default."""
    return next((int(entry[k]) for k in EXPERT_COUNT_KEYS if entry.get(k)), None)


def _sub_configs(config: Any) -> list[Any]:
    return [v for v in vars(config).values() if hasattr(v, "to_dict") and not isinstance(v, type)]
