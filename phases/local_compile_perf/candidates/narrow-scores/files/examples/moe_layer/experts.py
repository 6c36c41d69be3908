"""Routed experts: SwiGLU on grouped GEMMs over one EP rank's local experts.

Rows arrive sorted by local expert with ``counts[e]`` rows each. ``w13`` packs gate and
up projections ``[E, 2F, D]``; ``w2`` is ``[E, D, F]``. The routing weights scale the
SwiGLU output (width ``F``) inside the ``swiglu`` region, before ``w2``: row scaling
commutes with the GEMM, and ``F`` is narrower than ``D``.

``torch._grouped_mm`` is the GEMM. Where it cannot run fwd+bwd (CPU fp32 backward in
torch 2.13, for one), and only on CPU, a per-expert loop of plain matmuls stands in;
``GroupedExperts.backend`` says which one ran.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

from .local_compile import local_compile

ExpertBackend = Literal["grouped_mm", "per_expert_loop"]


def probe_grouped_mm(device: torch.device, dtype: torch.dtype) -> bool:
    """Return True when ``torch._grouped_mm`` runs fwd+bwd here, empty groups included."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    x = torch.randn(16, 16, device=device, dtype=dtype, requires_grad=True)
    w = torch.randn(4, 32, 16, device=device, dtype=dtype, requires_grad=True)
    offs = torch.tensor([4, 4, 12, 16], device=device, dtype=torch.int32)
    try:
        torch._grouped_mm(x, w.transpose(-2, -1), offs=offs).float().sum().backward()
    except RuntimeError:
        return False
    return True


def resolve_expert_backend(device: torch.device, dtype: torch.dtype) -> ExpertBackend:
    """Pick the GEMM path; off CPU a missing grouped GEMM is an error, not a fallback."""
    if probe_grouped_mm(device, dtype):
        return "grouped_mm"
    if device.type != "cpu":
        raise RuntimeError(
            f"torch._grouped_mm cannot run fwd+bwd on {device} in {dtype}; "
            "the per-expert loop is a CPU-only stand-in (check the torch build)"
        )
    return "per_expert_loop"


@local_compile("swiglu")
def expert_swiglu(h13: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Return ``silu(gate) * up * weights`` ``[R, F]`` from the packed ``[R, 2F]`` projection."""
    gate, up = h13.chunk(2, dim=-1)
    scaled = torch.nn.functional.silu(gate.float()) * up.float() * weights.unsqueeze(-1)
    return scaled.to(h13.dtype)


class GroupedExperts(nn.Module):
    def __init__(
        self, *, n_experts: int, dim: int, inter_dim: int, backend: ExpertBackend,
        device: torch.device, dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.backend = backend
        self.w13 = nn.Parameter(torch.empty(n_experts, 2 * inter_dim, dim, device=device, dtype=dtype))
        self.w2 = nn.Parameter(torch.empty(n_experts, dim, inter_dim, device=device, dtype=dtype))
        nn.init.uniform_(self.w13, -1 / math.sqrt(dim), 1 / math.sqrt(dim))
        nn.init.uniform_(self.w2, -1 / math.sqrt(inter_dim), 1 / math.sqrt(inter_dim))

    def forward(self, x: torch.Tensor, counts: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Return weighted expert outputs ``[R, D]`` for rows ``x`` ``[R, D]`` sorted by expert."""
        h = expert_swiglu(self._matmul(x, self.w13, counts), weights)  # [R, F]
        return self._matmul(h, self.w2, counts)  # [R, D]

    def _matmul(self, x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        if self.backend == "grouped_mm":
            offs = counts.cumsum(0).to(torch.int32)
            return torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
        chunks = x.split(counts.tolist())
        return torch.cat([chunk @ w[e].T for e, chunk in enumerate(chunks)])
