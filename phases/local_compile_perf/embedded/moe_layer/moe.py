"""The MoE feed-forward of one EP rank: full-width router, local dispatch, shared expert.

One device stands for one EP rank: routed expert ``e`` runs on local slot
``e % n_local_experts``. Each token's ``top_k`` choices all land on local experts, so
the grouped GEMMs see ``T * top_k`` rows over ``n_local_experts`` groups, the load of an
EP rank under balanced routing. EP-only ops (all-to-all, permutes) are not modelled.
"""

from __future__ import annotations

import torch
from torch import nn

from .config import MoELayerConfig
from .experts import ExpertBackend, GroupedExperts
from .router import Router


class FeedForward(nn.Module):
    """SwiGLU MLP: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, dim: int, inter_dim: int, *, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, inter_dim, bias=False, device=device, dtype=dtype)
        self.w3 = nn.Linear(dim, inter_dim, bias=False, device=device, dtype=dtype)
        self.w2 = nn.Linear(inter_dim, dim, bias=False, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


def dispatch_tokens(
    x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor, *, n_local: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return rows sorted by local expert, per-expert counts, their weights and source tokens."""
    top_k = experts.shape[-1]
    local = (experts % n_local).flatten()  # [T * top_k]
    order = local.argsort(stable=True)
    token_index = order // top_k
    # NOTE: not bincount: its output size depends on the data, a graph break under compile.
    counts = torch.zeros(n_local, dtype=torch.int64, device=x.device).index_add_(0, local, torch.ones_like(local))
    return x[token_index], counts, weights.flatten()[order], token_index


def combine_tokens(rows: torch.Tensor, token_index: torch.Tensor, *, tokens: int) -> torch.Tensor:
    """Sum expert rows back onto their tokens in fp32; returns ``[tokens, D]`` in rows' dtype."""
    out = rows.new_zeros(tokens, rows.shape[-1], dtype=torch.float32)
    return out.index_add_(0, token_index, rows.float()).to(rows.dtype)


class MoE(nn.Module):
    def __init__(
        self, config: MoELayerConfig, *, backend: ExpertBackend, device: torch.device, dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.config = config
        self.router = Router(config, device=device, dtype=dtype)
        self.experts = GroupedExperts(
            n_experts=config.n_local_experts, dim=config.dim, inter_dim=config.moe_inter_dim,
            backend=backend, device=device, dtype=dtype,
        )
        shared_dim = config.moe_inter_dim * config.n_shared_experts
        self.shared = FeedForward(config.dim, shared_dim, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = self.router(x)
        rows, counts, row_weights, token_index = dispatch_tokens(
            x, experts, weights, n_local=self.config.n_local_experts
        )
        routed = combine_tokens(self.experts(rows, counts, row_weights), token_index, tokens=x.shape[0])
        return routed + self.shared(x)
