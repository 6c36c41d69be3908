"""``--weights DIR``: a local Hugging Face checkpoint for the skill's pretrained test (Phase 3b).

Checked at start, engine side and without torch, so a bad directory is refused (exit 2)
before anything is written: the directory exists and lists, its config.json is a JSON object
with a model_type equal to the model's, and it holds at least one safetensors file whose
header reads (8-byte little-endian length, then a JSON table of tensors). Nothing is downloaded.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from pydantic import BaseModel

from orchestrator.errors import UsageError

# A safetensors header larger than this is not a header (the format caps it at 100 MB).
MAX_HEADER_BYTES = 100_000_000


class WeightsDir(BaseModel):
    """What start read from the checkpoint directory (recorded in the run's options)."""

    path: str
    model_type: str
    safetensors: list[str]
    tensors: int


def read_weights_dir(text: str) -> WeightsDir:
    """The checkpoint at ``text``, or a one-line UsageError naming what is wrong with it."""
    folder = Path(text).expanduser().resolve()
    where = f"--weights {text}"
    if not folder.exists():
        raise UsageError(f"{where}: no such directory (a local Hugging Face checkpoint: config.json + *.safetensors)")
    if not folder.is_dir():
        raise UsageError(f"{where}: not a directory (pass the checkpoint's folder, not a file in it)")
    try:
        names = sorted(p.name for p in folder.iterdir())
    except OSError as exc:
        raise UsageError(f"{where}: the directory cannot be read ({exc.strerror})") from None
    model_type = read_model_type(folder / "config.json", where=where)
    files = [name for name in names if name.endswith(".safetensors")]
    if not files:
        raise UsageError(f"{where}: no *.safetensors file (the pretrained test loads safetensors weights only)")
    tensors = sum(count_tensors(folder / name, where=where) for name in files)
    return WeightsDir(path=str(folder), model_type=model_type, safetensors=files, tensors=tensors)


def read_model_type(config: Path, *, where: str) -> str:
    if not config.is_file():
        raise UsageError(f"{where}: no config.json in the directory")
    try:
        data = json.loads(config.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{where}: config.json is not readable JSON ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0]})") from None
    model_type = data.get("model_type") if isinstance(data, dict) else None
    if not isinstance(model_type, str) or not model_type:
        raise UsageError(f"{where}: config.json has no model_type")
    return model_type


def count_tensors(file: Path, *, where: str) -> int:
    """Tensors listed in one safetensors header; a file that does not parse is refused."""
    try:
        with file.open("rb") as stream:
            (size,) = struct.unpack("<Q", stream.read(8))
            if size > MAX_HEADER_BYTES:
                raise ValueError(f"header length {size}")
            header = json.loads(stream.read(size))
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
    except (OSError, struct.error, ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"{where}: {file.name} is not a readable safetensors file ({type(exc).__name__})") from None
    return sum(1 for key in header if key != "__metadata__")


def check_model_type(weights: WeightsDir, model_type: str) -> None:
    """The checkpoint is of the model's type (its dimensions may differ: it is compared as it is)."""
    if weights.model_type != model_type:
        raise UsageError(f"--weights {weights.path}: config.json has model_type {weights.model_type}, but the model "
                         f"is {model_type}; pass a checkpoint of the same model type")
