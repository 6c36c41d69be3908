"""Worker side of ``start``: can the target import, and is MODEL a MoE config?

Runs in a subprocess of the target checkout before a run exists, so a torchtitan that
does not import here (e.g. torch too old for it) or a config without experts is refused
at start with exit 2 and nothing written.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

EXPERT_COUNT_KEYS = ("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts")
EXP_MODULES = ("moe_replacement", "state_dict_adapter", "hf_sharding")


def check_target(request: dict[str, Any]) -> dict[str, Any]:
    """Request: {"source": ModelSource}. Response: {"ok", "problem", "model_type", "experts"}."""
    import torch

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
    experts = next((getattr(config, k) for k in EXPERT_COUNT_KEYS if getattr(config, k, None)), None)
    if not experts:
        return {"ok": False, "model_type": config.model_type,
                "problem": f"{request['source']['model_id']}: config ({config.model_type}) has no MoE layers "
                           f"(none of {', '.join(EXPERT_COUNT_KEYS)} is set); this workflow adds MoE models"}
    return {"ok": True, "problem": None, "model_type": config.model_type, "experts": int(experts)}
