"""Build a transformers PretrainedConfig from a ModelSource (worker side).

Everything is offline: registry entries and config files go through the config class
directly (``AutoConfig.for_model``; ``type:`` takes the class's defaults in their MoE form,
see ``moe_form``); only kind "hub" asks ``AutoConfig.from_pretrained``,
with HF_HUB_OFFLINE=1 so a model that is not in the local cache fails at once with a
message that says what to pass instead. Multimodal wrappers (llama4, gemma4) are reduced
to their text config, which is what the MoE backend swaps.
"""

from __future__ import annotations

import os
from typing import Any

from phases.add_moe_model.model_source import ModelSource
from phases.add_moe_model.work.moe_form import moe_form_kwargs

# Keys a saved config.json carries that are bookkeeping, not architecture.
_BOOKKEEPING_KEYS = frozenset({"model_type", "transformers_version", "architectures", "auto_map", "_name_or_path"})


class HFConfigError(RuntimeError):
    """The HF config for a ModelSource could not be built; the message says what to pass."""

    code = "hf_config_unavailable"


def build_hf_config(source: ModelSource) -> Any:
    """Return the text PretrainedConfig for ``source``.

    Raises:
        HFConfigError: unknown model_type, or a hub id not available offline.
    """
    from transformers import AutoConfig

    if source.kind == "hub":
        config = _load_hub_config(source.model_id)
    else:
        kwargs = {k: v for k, v in source.config.items() if k not in _BOOKKEEPING_KEYS}
        try:
            if source.kind == "model_type":
                kwargs = moe_form_kwargs(source.model_type)
            config = AutoConfig.for_model(source.model_type, **kwargs)
        except (KeyError, ValueError) as exc:
            raise HFConfigError(
                f"{source.model_id}: transformers cannot build a config for model_type "
                f"{source.model_type!r} ({exc}); check the model_type or upgrade transformers"
            ) from exc
    return resolve_text_config(config)


class HFBuildError(HFConfigError):
    """transformers raised while building the model from the config (its code, its file and line)."""

    code = "hf_build_failed"


def raise_build_error(config: Any, exc: Exception) -> None:
    """Re-raise ``exc`` from transformers' model construction as an HFBuildError naming where it was raised."""
    import traceback

    frame = traceback.extract_tb(exc.__traceback__)[-1]
    where = f"{frame.filename.split('/site-packages/')[-1]}:{frame.lineno}"
    raise HFBuildError(f"transformers cannot build the {config.model_type} model from this config: "
                       f"{type(exc).__name__}: {exc} (raised at {where}); the fix is the config "
                       "(a published config.json) or transformers, not torchtitan") from exc


def resolve_text_config(config: Any) -> Any:
    """Return the decoder (text) config of a possibly multimodal config."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return text if text is not None else config


def _load_hub_config(model_id: str) -> Any:
    from transformers import AutoConfig

    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        return AutoConfig.from_pretrained(model_id, trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - transformers raises many types offline
        raise HFConfigError(
            f"{model_id}: not in the bundled registry and not reachable offline; pass a config.json "
            "path (or a directory holding one) as MODEL, or add the model to "
            f"phases/kit/registry.json ({type(exc).__name__})"
        ) from exc
