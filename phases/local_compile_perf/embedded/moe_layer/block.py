"""A pre-norm decoder block: ``h = x + attn(norm(x))``, ``out = h + ffn(norm(h))``.

``kind="dense"`` uses the dense SwiGLU (DSv3's first layers), ``kind="moe"`` the MoE.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from .attention import MLAttention
from .config import MoELayerConfig
from .experts import ExpertBackend
from .moe import MoE, FeedForward
from .norm import RMSNorm

BlockKind = Literal["dense", "moe"]


class Block(nn.Module):
    def __init__(
        self, config: MoELayerConfig, *, kind: BlockKind, backend: ExpertBackend,
        device: torch.device, dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.kind = kind
        self.attention_norm = RMSNorm(config.dim, eps=config.norm_eps, device=device, dtype=dtype)
        self.attention = MLAttention(config, device=device, dtype=dtype)
        self.ffn_norm = RMSNorm(config.dim, eps=config.norm_eps, device=device, dtype=dtype)
        if kind == "moe":
            self.ffn: nn.Module = MoE(config, backend=backend, device=device, dtype=dtype)
        else:
            self.ffn = FeedForward(config.dim, config.inter_dim, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.ffn(self.ffn_norm(h))
