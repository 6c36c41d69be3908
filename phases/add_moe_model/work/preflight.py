"""Worker side of ``start``: can the target import, and is MODEL a MoE config?

Runs in a subprocess of the target checkout before a run exists, so a torchtitan that
does not import here (e.g. torch too old for it) or a config without experts is refused
at start with exit 2 and nothing written.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

from phases.add_moe_model.work.config_fields import EXPERT_COUNT_KEYS, expert_count

EXP_MODULES = ("moe_replacement", "state_dict_adapter", "hf_sharding")


def check_target(request: dict[str, Any]) -> dict[str, Any]:
    """Request: {"source": ModelSource}. Response: {"ok", "problem", "model_type", "experts"}."""
    import torch
    from transformers import AutoModelForCausalLM

    from phases.add_moe_model.model_source import ModelSource
    from phases.add_moe_model.work.hf_config import HFConfigError, build_hf_config

    for name in EXP_MODULES:
        module = f"torchtitan.experiments.transformers_modeling_backend.{name}"
        try:
            __import__(module)
        except Exception as exc:  # noqa: BLE001 (any import failure is the answer)
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            return {"ok": False, "problem": f"the target's {module} does not import with torch "
                    f"{torch.__version__} (python {sys.version.split()[0]}): {last}"}
    try:
        config = build_hf_config(ModelSource.model_validate(request["source"]))
    except HFConfigError as exc:
        return {"ok": False, "problem": str(exc)}
    experts = expert_count(config)
    if not experts:
        return {"ok": False, "model_type": config.model_type, "code": "not_moe",
                "problem": f"{request['source']['model_id']}: config ({config.model_type}) has no MoE layers "
                           f"(none of {', '.join(EXPERT_COUNT_KEYS)} is set, in the config or a sub-config); "
                           "this workflow adds MoE models"}
    if type(config) not in AutoModelForCausalLM._model_mapping:
        return {"ok": False, "model_type": config.model_type, "code": "not_causal_lm",
                "problem": f"{request['source']['model_id']}: transformers has no AutoModelForCausalLM class for "
                           f"{type(config).__name__} (not a decoder-only causal LM, e.g. the text half of a "
                           "multimodal model); the backend builds models through AutoModelForCausalLM"}
    return {"ok": True, "problem": None, "model_type": config.model_type, "experts": int(experts)}
