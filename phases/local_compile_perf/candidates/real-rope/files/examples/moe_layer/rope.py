"""Rotary embedding on interleaved pairs, in real arithmetic.

The cache holds ``exp(i * t * theta_j)`` as complex64 ``[tokens, rope_dim // 2]``. The
rotation of each (even, odd) pair is written out with the cache's cos and sin: the same
math as the complex product, without complex ops (Inductor cannot fuse those).
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
    cos, sin = torch.view_as_real(freqs_cis).unsqueeze(1).unbind(-1)  # [T, 1, D/2] each
    even, odd = x.float().unflatten(-1, (-1, 2)).unbind(-1)  # [T, H, D/2] each
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2).to(x.dtype)
