"""Rotary embedding on interleaved pairs, in complex arithmetic (DeepSeek-V3's form).

The cache holds ``exp(i * t * theta_j)`` as complex64 ``[tokens, rope_dim // 2]``; a
RoPE'd vector is the complex product of each (even, odd) pair with its cache entry.
"""

from __future__ import annotations

import torch

from .local_compile import local_compile


def build_rope_cache(tokens: int, rope_dim: int, *, theta: float, device: torch.device) -> torch.Tensor:
    """Return the complex64 cache ``[tokens, rope_dim // 2]`` for positions 0..tokens-1."""
    inv_freq = 1.0 / theta ** (torch.arange(0, rope_dim, 2, device=device, dtype=torch.float32) / rope_dim)
    angles = torch.outer(torch.arange(tokens, device=device, dtype=torch.float32), inv_freq)
    return torch.polar(torch.ones_like(angles), angles)


@local_compile("rope")
def apply_rope(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[T, H, D]`` by ``freqs_cis`` ``[T, D // 2]``; same shape and dtype."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))  # [T, H, D/2]
    rotated = pairs * freqs_cis.unsqueeze(1)
    return torch.view_as_real(rotated).flatten(-2).to(x.dtype)
