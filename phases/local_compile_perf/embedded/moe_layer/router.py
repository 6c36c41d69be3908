"""DeepSeek-V3 router: sigmoid scores, correction bias, group-limited top-k.

The bias only picks experts; the weights come from the unbiased scores, normalized over
the chosen experts and multiplied by ``route_scale``. The router is always full width
(every routed expert), also when one device stands for one EP rank.
"""

from __future__ import annotations

import torch
from torch import nn

from .config import MoELayerConfig
from .local_compile import local_compile


@local_compile("router")
def route_tokens(
    logits: torch.Tensor,
    correction_bias: torch.Tensor,
    *,
    n_groups: int,
    topk_groups: int,
    top_k: int,
    route_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return fp32 weights ``[T, top_k]`` and expert ids ``[T, top_k]`` for ``logits`` ``[T, E]``."""
    scores = logits.float().sigmoid()
    biased = scores + correction_bias
    tokens, n_experts = biased.shape
    grouped = biased.view(tokens, n_groups, n_experts // n_groups)
    group_scores = grouped.topk(2, dim=-1).values.sum(-1)  # [T, G]
    kept = group_scores.topk(topk_groups, dim=-1).indices  # [T, topk_groups]
    keep_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter(1, kept, True)
    masked = grouped.masked_fill(~keep_mask.unsqueeze(-1), float("-inf")).view(tokens, n_experts)
    experts = masked.topk(top_k, dim=-1).indices
    weights = scores.gather(1, experts)
    weights = weights / weights.sum(-1, keepdim=True) * route_scale
    return weights, experts


class Router(nn.Module):
    def __init__(self, config: MoELayerConfig, *, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.config = config
        self.gate = nn.Linear(config.dim, config.n_routed_experts, bias=False, device=device, dtype=dtype)
        # NOTE: seeded non-zero bias (training starts at zero) so the harness exercises
        # the bias changing the choice of experts.
        bias = 1e-2 * torch.randn(config.n_routed_experts, device=device, dtype=torch.float32)
        self.register_buffer("correction_bias", bias)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.config
        return route_tokens(
            self.gate(x),
            self.correction_bias,
            n_groups=c.n_groups,
            topk_groups=c.topk_groups,
            top_k=c.top_k,
            route_scale=c.route_scale,
        )
