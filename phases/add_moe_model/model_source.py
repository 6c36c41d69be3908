"""Resolve the MODEL option of add_moe_model into a ModelSource (engine side, no torch).

MODEL may be a Hugging Face id or alias from the bundled registry (real published
dimensions, kept as data in the kit's registry.json: ``phases.kit.registry``), a local directory or config.json, or
``type:<model_type>`` for a transformers config class's defaults. Anything else that
looks like a hub id becomes kind "hub": only the worker can tell whether transformers
finds it offline, so it is validated there, not here. Input that is wrong on its face
(missing file, malformed JSON, no model_type) fails here, before any run state is written.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from phases.kit.registry import find_registry_entry

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
_MODEL_TYPE = re.compile(r"^[a-z0-9_][a-z0-9_-]*$")


class ModelSourceError(ValueError):
    """The MODEL text cannot be turned into a config source; the message says why."""

    code = "bad_model_source"


class ModelSource(BaseModel):
    """Where the probe gets the model's HF config from (crosses into the worker)."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["registry", "config_file", "model_type", "hub"]
    model_id: str
    """Name shown in reports: the hub id, the config path or ``type:<model_type>``."""
    model_type: str | None = None
    """Known for registry, config_file and model_type kinds; None for hub."""
    config: dict[str, Any] = {}
    """Config kwargs (registry) or the parsed config.json (config_file)."""
    path: str | None = None
    """Absolute path of the config.json for kind config_file."""
    name: str = ""
    """The model's name in the branch, MODEL_COMPATIBILITY.md and the commit message (``model_name``)."""
    name_source: str = ""
    """Where ``name`` was read: "registry id", "hub id", "type:", or for a config.json the field or folder."""


def resolve_model_source(text: str) -> ModelSource:
    """Turn the raw MODEL text into a ModelSource.

    Raises:
        ModelSourceError: empty text, a missing or malformed config file, a bad
            ``type:`` name, or text that is neither a path nor a hub id.
    """
    text = (text or "").strip()
    if not text:
        raise ModelSourceError("MODEL is empty; pass a hub id, a config.json path or type:<model_type>")
    if text.startswith("type:"):
        return _model_type_source(text.removeprefix("type:").strip())
    entry = find_registry_entry(text)
    if entry is not None:
        return ModelSource(kind="registry", model_id=entry.hf_id, model_type=entry.model_type, config=entry.config,
                           name=last_segment(entry.hf_id), name_source="registry id")
    if _looks_like_path(text):
        return _config_file_source(Path(text).expanduser())
    if _HUB_ID.match(text):
        return ModelSource(kind="hub", model_id=text, name=last_segment(text), name_source="hub id")
    raise ModelSourceError(
        f"MODEL {text!r} is not a registry id, an existing path, a hub id (owner/name) "
        "or type:<model_type>"
    )


def _looks_like_path(text: str) -> bool:
    return text.startswith((".", "/", "~")) or text.endswith(".json") or Path(text).exists()


def _model_type_source(model_type: str) -> ModelSource:
    if not _MODEL_TYPE.match(model_type):
        raise ModelSourceError(
            f"type:{model_type!r} is not a transformers model_type (lowercase, digits, '_', '-')"
        )
    return ModelSource(kind="model_type", model_id=f"type:{model_type}", model_type=model_type, name=model_type,
                       name_source="type:")


def _config_file_source(path: Path) -> ModelSource:
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise ModelSourceError(f"config file not found: {file} (pass a directory holding config.json)")
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise ModelSourceError(f"{file}: not valid JSON ({exc})") from exc
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise ModelSourceError(f"{file}: no string 'model_type' at the top level")
    name, name_source = config_file_name(config, file.resolve())
    return ModelSource(
        kind="config_file",
        model_id=str(file.resolve()),
        model_type=config["model_type"],
        config=config,
        path=str(file.resolve()),
        name=name,
        name_source=name_source,
    )


def config_file_name(config: dict[str, Any], file: Path) -> tuple[str, str]:
    """A config.json model's name and where it was read: the config's ``_name_or_path``, its first
    ``architectures`` entry, the folder holding the file, else its ``model_type`` (never "config.json")."""
    named = config.get("_name_or_path")
    if isinstance(named, str) and last_segment(named) not in ("", ".", ".."):
        return last_segment(named), "config _name_or_path"
    architectures = config.get("architectures")
    if isinstance(architectures, list) and architectures and isinstance(architectures[0], str):
        return architectures[0], "config architectures[0]"
    if file.parent.name:
        return file.parent.name, "folder of the config.json"
    return config["model_type"], "config model_type"


def last_segment(name: str) -> str:
    """"Qwen3-30B-A3B" of "Qwen/Qwen3-30B-A3B" or of "/models/Qwen3-30B-A3B/"."""
    return name.rstrip("/").split("/")[-1].strip()


def model_name(options: dict[str, Any]) -> str:
    """The run's model name as start recorded it; runs from before it was recorded: the id's last segment."""
    recorded = options.get("model_name")
    if recorded:
        return str(recorded)
    return last_segment(str(options.get("model_id") or options.get("model") or "model")).removeprefix("type:")
