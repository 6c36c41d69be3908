"""Phase 4 worker: what the skill's torchrun jobs need, made locally (nothing downloaded).

The trainer config reads ``--hf_model`` (a hub id), ``./tests/assets/tokenizer`` and the
``c4_test`` dataset from a torchtitan source checkout; a workspace made from the wheel has
none of them and the machines that run the jobs may have no network. So this worker makes:
- ``hf_config/config.json``: the run's synthetic config as a local HF checkpoint directory;
- ``tokenizer/``: a small BPE tokenizer trained here on generated text, its vocabulary
  inside the synthetic config's ``vocab_size``, with BOS/EOS tokens;
- ``c4_test/data.json``: JSON lines ``{"text": ...}`` in the shape of torchtitan's c4_test.
It also reports the torch compatibility pieces this environment needs and whether its FSDP
can shard at world sizes above 1 (``torch_compat.fsdp_capability``).
"""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel

BOS, EOS, UNK = "<|begin_of_text|>", "<|end_of_text|>", "<unk>"
LETTERS = "abcdefghijklmnopqrstuvwxyz"


class AssetsRequest(BaseModel):
    model_type: str
    config_kwargs: dict[str, Any]
    documents: int = 200
    seed: int = 0


class AssetsResult(BaseModel):
    files: dict[str, str]
    """Relative path -> text content (hf_config/..., tokenizer/..., c4_test/data.json)."""
    vocab_size: int
    compat: dict[str, Any]
    fsdp: dict[str, Any]
    cuda_devices: int


def make_assets(request: dict[str, Any]) -> dict[str, Any]:
    """Request: ``AssetsRequest``; response: ``AssetsResult``."""
    import torch

    from phases.add_moe_model.work.build_check import save_synthetic_config
    from phases.add_moe_model.work.torch_compat import fsdp_capability, report

    req = AssetsRequest.model_validate(request)
    files: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="hf_cfg_") as cfg_dir:
        save_synthetic_config(req.model_type, req.config_kwargs, cfg_dir)
        files["hf_config/config.json"] = Path(cfg_dir, "config.json").read_text()
    vocab = int(json.loads(files["hf_config/config.json"]).get("vocab_size", 256))
    texts = generated_texts(req.documents, seed=req.seed)
    files.update(tokenizer_files(texts, vocab_size=min(vocab, 256)))
    files["c4_test/data.json"] = "".join(json.dumps({"text": t}) + "\n" for t in texts)
    from phases.add_moe_model.work import torch_compat

    return AssetsResult(files=files, vocab_size=min(vocab, 256), compat=report(torch_compat.applied_here()),
                        fsdp=fsdp_capability(), cuda_devices=torch.cuda.device_count()).model_dump()


def generated_texts(count: int, *, seed: int) -> list[str]:
    """Deterministic pseudo-words over a-z, a few hundred characters each."""
    rng = random.Random(seed)
    words = ["".join(rng.choice(LETTERS) for _ in range(rng.randint(2, 7))) for _ in range(400)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(60, 120))) for _ in range(count)]


def tokenizer_files(texts: list[str], *, vocab_size: int) -> dict[str, str]:
    """tokenizer.json and tokenizer_config.json of a BPE tokenizer trained on ``texts``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[UNK, BOS, EOS], show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    config = {"bos_token": BOS, "eos_token": EOS, "unk_token": UNK, "add_bos_token": True,
              "add_eos_token": False, "model_max_length": 1 << 20}
    return {"tokenizer/tokenizer.json": tokenizer.to_str(), "tokenizer/tokenizer_config.json": json.dumps(config)}
