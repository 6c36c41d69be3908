"""Routed experts: SwiGLU on grouped GEMMs over one EP rank's local experts.

Rows arrive sorted by local expert with ``counts[e]`` rows each. ``w13`` packs gate and
up projections ``[E, 2F, D]``; ``w2`` is ``[E, D, F]``. The routing weights scale the
wide expert output (after ``w2``, width ``D``) in eager code.

``torch._grouped_mm`` is the GEMM. Where it cannot run fwd+bwd (CPU fp32 backward in
torch 2.13, for one; CUDA fp32 and fp64 references), a per-expert loop of plain matmuls
stands in, for a bf16 model only on CPU; ``GroupedExperts.backend`` says which one ran.
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
    """Pick the GEMM path; off CPU a bf16 model without the grouped GEMM is an error, not a fallback.

    fp32 and fp64 (correctness captures and the reference, never timed) take the per-expert
    loop wherever the grouped GEMM lacks them (CUDA's is bf16-only): same math, one GEMM per expert.
    """
    if probe_grouped_mm(device, dtype):
        return "grouped_mm"
    if device.type != "cpu" and dtype == torch.bfloat16:
        raise RuntimeError(
            f"torch._grouped_mm cannot run fwd+bwd on {device} in {dtype}; "
            "the per-expert loop stands in only on CPU or for fp32/fp64 references (check the torch build)"
        )
    return "per_expert_loop"


@local_compile("swiglu")
def expert_swiglu(h13: torch.Tensor) -> torch.Tensor:
    """Return ``silu(gate) * up`` ``[R, F]`` from the packed ``[R, 2F]`` projection."""
    gate, up = h13.chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate.float()) * up.float()).to(h13.dtype)


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
        h = expert_swiglu(self._matmul(x, self.w13, counts))  # [R, F]
        out = self._matmul(h, self.w2, counts)  # [R, D]
        return (out.float() * weights.unsqueeze(-1)).to(out.dtype)

    def _matmul(self, x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        if self.backend == "grouped_mm":
            offs = counts.cumsum(0).to(torch.int32)
            return torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
        chunks = x.split(counts.tolist())
        return torch.cat([chunk @ w[e].T for e, chunk in enumerate(chunks)])
