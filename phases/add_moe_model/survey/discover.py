"""Worker: the MoE model types of the installed transformers, found from its own sources.

A modeling family is MoE when its ``modeling_<name>.py`` defines an experts or MoE module
(a class named ``...Experts``, ``...SparseMoeBlock``, ``...MoE``/``...Moe``, ``...MoELayer``).
One row per family: the config that has a causal-LM class (the text half of a multimodal
family when it has one, else the family's own type), or, when no config of the family has
one, the family's text config (``..._text``) or its own type, which start then refuses with
the reason. The files are read as text, nothing is imported per family.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

MOE_CLASS = re.compile(r"^class (\w*(?:Experts|SparseMoeBlock|MoE|Moe|MoeBlock|MoELayer))\(", re.M)


def list_moe_models(request: dict[str, Any]) -> dict[str, Any]:
    """Request: {}. Response: {"transformers": version, "models": [{"model_type", "family", "moe_classes"}]}."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES, model_type_to_module_name
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    root = Path(transformers.__file__).parent / "models"
    families: dict[str, list[str]] = {}
    classes: dict[str, list[str]] = {}
    for model_type in CONFIG_MAPPING_NAMES:
        family = model_type_to_module_name(model_type)
        source = root / family / f"modeling_{family}.py"
        found = MOE_CLASS.findall(source.read_text()) if source.is_file() else []
        if found:
            families.setdefault(family, []).append(model_type)
            classes[family] = found[:4]
    models = [{"model_type": pick_model_type(family, types, causal=MODEL_FOR_CAUSAL_LM_MAPPING_NAMES),
               "family": family, "moe_classes": classes[family]} for family, types in sorted(families.items())]
    return {"transformers": transformers.__version__, "models": models}


def pick_model_type(family: str, types: list[str], *, causal: Any) -> str:
    """The family's decoder config: a text config with a causal-LM class first."""
    with_lm = [t for t in types if t in causal]
    for pool in (with_lm, types):
        text = [t for t in pool if t.endswith("_text")]
        if text:
            return text[0]
        if family in pool or (pool and pool is with_lm):
            return family if family in pool else pool[0]
    return types[0]
