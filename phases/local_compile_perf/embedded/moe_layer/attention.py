"""Multi-head latent attention (DeepSeek-V3), no KV cache, causal over packed tokens.

Queries go through a latent: ``wq_b(q_norm(wq_a(x)))``. Keys and values share a latent
``kv_norm(kv_c)`` expanded by ``wkv_b``; one RoPE'd key slice ``k_pe`` is shared by all
heads. The RoPE'd slices are joined to the un-rotated ones with a cat (query and key).
"""

from __future__ import annotations

import torch
from torch import nn

from .config import MoELayerConfig
from .norm import RMSNorm
from .rope import apply_rope


class MLAttention(nn.Module):
    def __init__(self, config: MoELayerConfig, *, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        c = self.config = config
        kw = dict(bias=False, device=device, dtype=dtype)
        self.wq_a = nn.Linear(c.dim, c.q_lora_rank, **kw)
        self.q_norm = RMSNorm(c.q_lora_rank, eps=c.norm_eps, device=device, dtype=dtype)
        self.wq_b = nn.Linear(c.q_lora_rank, c.n_heads * c.qk_head_dim, **kw)
        self.wkv_a = nn.Linear(c.dim, c.kv_lora_rank + c.qk_rope_head_dim, **kw)
        self.kv_norm = RMSNorm(c.kv_lora_rank, eps=c.norm_eps, device=device, dtype=dtype)
        self.wkv_b = nn.Linear(c.kv_lora_rank, c.n_heads * (c.qk_nope_head_dim + c.v_head_dim), **kw)
        self.wo = nn.Linear(c.n_heads * c.v_head_dim, c.dim, **kw)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        """Return ``[T, D]`` for ``x`` ``[T, D]``."""
        q, k, v = self._project_qkv(x, freqs_cis)  # [T, H, qk], [T, H, qk], [T, H, v]
        out = nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0),
            is_causal=True, scale=self.config.qk_head_dim**-0.5,
        )  # [1, H, T, v]
        return self.wo(out.squeeze(0).transpose(0, 1).flatten(1))

    def _project_qkv(
        self, x: torch.Tensor, freqs_cis: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        c, tokens = self.config, x.shape[0]
        q = self.wq_b(self.q_norm(self.wq_a(x))).view(tokens, c.n_heads, c.qk_head_dim)
        q_nope, q_pe = q.split([c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
        q = torch.cat([q_nope, apply_rope(q_pe, freqs_cis)], dim=-1)
        kv_c, k_pe = self.wkv_a(x).split([c.kv_lora_rank, c.qk_rope_head_dim], dim=-1)
        kv = self.wkv_b(self.kv_norm(kv_c)).view(tokens, c.n_heads, c.qk_nope_head_dim + c.v_head_dim)
        k_nope, v = kv.split([c.qk_nope_head_dim, c.v_head_dim], dim=-1)
        k_pe = apply_rope(k_pe.unsqueeze(1), freqs_cis)  # [T, 1, rope]
        k = torch.cat([k_nope, k_pe.expand(-1, c.n_heads, -1)], dim=-1)
        return q, k, v
