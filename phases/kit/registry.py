"""The bundled registry of real MoE models (``registry.json``): published dims both workflows build from.

add-moe-model resolves a MODEL given as a Hugging Face id or alias to its entry (``find_registry_entry``);
local-compile-perf's ``hf:<model_type>`` harness takes an entry's config as the layer's dims. One typed
reader for both (stdlib and pydantic only, no torch).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

REGISTRY_PATH = Path(__file__).with_name("registry.json")


class RegistryEntry(BaseModel):
    """One real MoE model in registry.json."""

    model_config = ConfigDict(frozen=True)

    hf_id: str
    aliases: tuple[str, ...] = ()
    model_type: str
    provenance: str
    config: dict[str, Any]


@cache
def load_registry() -> tuple[RegistryEntry, ...]:
    """Return the bundled registry entries."""
    raw = json.loads(REGISTRY_PATH.read_text())
    return tuple(RegistryEntry.model_validate(m) for m in raw["models"])


def find_registry_entry(text: str) -> RegistryEntry | None:
    """Return the entry whose hf_id or alias equals ``text`` (case-insensitive)."""
    wanted = text.strip().lower()
    for entry in load_registry():
        if wanted in {entry.hf_id.lower(), *(a.lower() for a in entry.aliases)}:
            return entry
    return None
