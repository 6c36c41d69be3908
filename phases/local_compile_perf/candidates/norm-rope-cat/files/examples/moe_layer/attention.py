"""Multi-head latent attention (DeepSeek-V3), no KV cache, causal over packed tokens.

Queries go through a latent: ``wq_b(q_norm(wq_a(x)))``. Keys and values share a latent
``kv_norm(kv_c)`` expanded by ``wkv_b``; one RoPE'd key slice ``k_pe`` is shared by all
heads. Everything between the ``wq_a``/``wkv_a`` projections and attention (the latent
norms, ``wq_b``/``wkv_b``, RoPE, the cats joining rotated and plain slices) is one region,
``mla_qk``, so the cats fuse with RoPE instead of copying through memory.
"""

from __future__ import annotations

import torch
from torch import nn

from .config import MoELayerConfig
from .local_compile import local_compile
from .norm import RMSNorm, rms_norm
from .rope import apply_rope


@local_compile("mla_qk")
def build_qk(
    q_latent: torch.Tensor,
    kv_latent: torch.Tensor,
    freqs_cis: torch.Tensor,
    weights: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    *,
    config: MoELayerConfig,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return q, k ``[T, H, qk]`` and v ``[T, H, v]`` from the ``wq_a``/``wkv_a`` outputs.

    ``weights`` = (q_norm, wq_b, kv_norm, wkv_b) weights.
    """
    # NOTE: the raw bodies of the rms_norm/rope regions, so this region traces them even
    # when those regions are enabled on their own.
    norm, rope = rms_norm.__wrapped__, apply_rope.__wrapped__
    c, tokens = config, q_latent.shape[0]
    q_norm_w, wq_b, kv_norm_w, wkv_b = weights
    q = nn.functional.linear(norm(q_latent, q_norm_w, c.norm_eps), wq_b).view(tokens, c.n_heads, c.qk_head_dim)
    q_nope, q_pe = q.split([c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
    q = torch.cat([q_nope, rope(q_pe, freqs_cis)], dim=-1)
    kv_c, k_pe = kv_latent.split([c.kv_lora_rank, c.qk_rope_head_dim], dim=-1)
    kv = nn.functional.linear(norm(kv_c, kv_norm_w, c.norm_eps), wkv_b)
    k_nope, v = kv.view(tokens, c.n_heads, -1).split([c.qk_nope_head_dim, c.v_head_dim], dim=-1)
    k_pe = rope(k_pe.unsqueeze(1), freqs_cis)  # [T, 1, rope]
    k = torch.cat([k_nope, k_pe.expand(-1, c.n_heads, -1)], dim=-1)
    return q, k, v


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
        weights = (self.q_norm.weight, self.wq_b.weight, self.kv_norm.weight, self.wkv_b.weight)
        q, k, v = build_qk(self.wq_a(x), self.wkv_a(x), freqs_cis, weights, config=self.config)
        out = nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0),
            is_causal=True, scale=self.config.qk_head_dim**-0.5,
        )  # [1, H, T, v]
        return self.wo(out.squeeze(0).transpose(0, 1).flatten(1))
