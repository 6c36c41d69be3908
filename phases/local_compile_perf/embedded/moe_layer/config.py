"""Layer dimensions: DeepSeek-V3 at real size, and a small copy with the same structure.

``dsv3_config("real")`` carries the published DeepSeek-V3 dims. ``dsv3_config("small")``
keeps every structural choice (MLA with a q latent, sigmoid router with correction bias,
group-limited top-k, one shared expert, one dense + one MoE block) and shrinks each dim so
a CPU can run fwd+bwd in seconds; every width stays a multiple of 8 so bf16
``torch._grouped_mm`` strides stay 16-byte aligned.

One GPU stands for one expert-parallel rank: the router scores all ``n_routed_experts``
(full width), and the grouped GEMMs hold ``n_routed_experts // ep_degree`` local experts
(DSv3 at EP8: 32).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

Scale = Literal["real", "small"]


@dataclass(frozen=True, kw_only=True, slots=True)
class MoELayerConfig:
    """Dims of one decoder block pair (dense + MoE).

    Attributes:
        dim: hidden size, e.g. 7168.
        n_heads: attention heads, e.g. 128.
        q_lora_rank: width of the query latent, e.g. 1536.
        kv_lora_rank: width of the key/value latent, e.g. 512.
        qk_nope_head_dim: per-head query/key width without RoPE, e.g. 128.
        qk_rope_head_dim: per-head query/key width with RoPE, e.g. 64.
        v_head_dim: per-head value width, e.g. 128.
        inter_dim: dense SwiGLU width, e.g. 18432.
        moe_inter_dim: routed/shared expert SwiGLU width, e.g. 2048.
        n_routed_experts: experts the router scores, e.g. 256.
        n_shared_experts: always-on experts (one SwiGLU of n * moe_inter_dim), e.g. 1.
        n_groups: expert groups for group-limited routing, e.g. 8.
        topk_groups: groups kept per token, e.g. 4.
        top_k: experts per token, e.g. 8.
        route_scale: factor on the normalized routing weights, e.g. 2.5.
        ep_degree: expert-parallel degree this one device stands for, e.g. 8.
        rope_theta: RoPE base, e.g. 10000.0.
        norm_eps: RMSNorm epsilon, e.g. 1e-6.
    """

    dim: int
    n_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    inter_dim: int
    moe_inter_dim: int
    n_routed_experts: int
    n_shared_experts: int
    n_groups: int
    topk_groups: int
    top_k: int
    route_scale: float
    ep_degree: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        problems = []
        if self.n_routed_experts % self.ep_degree:
            problems.append(f"n_routed_experts {self.n_routed_experts} % ep_degree {self.ep_degree} != 0")
        if self.n_routed_experts % self.n_groups:
            problems.append(f"n_routed_experts {self.n_routed_experts} % n_groups {self.n_groups} != 0")
        if not 0 < self.topk_groups <= self.n_groups:
            problems.append(f"topk_groups {self.topk_groups} not in 1..n_groups {self.n_groups}")
        per_group = self.n_routed_experts // self.n_groups
        if self.top_k > self.topk_groups * per_group:
            problems.append(f"top_k {self.top_k} > experts in kept groups {self.topk_groups * per_group}")
        if self.qk_rope_head_dim % 2:
            problems.append(f"qk_rope_head_dim {self.qk_rope_head_dim} must be even")
        if problems:
            raise ValueError("MoELayerConfig: " + "; ".join(problems) + " (fix in examples/moe_layer/config.py)")

    @property
    def n_local_experts(self) -> int:
        """Experts held by one EP rank (the grouped GEMM's group count)."""
        return self.n_routed_experts // self.ep_degree

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


DSV3_REAL = MoELayerConfig(
    dim=7168,
    n_heads=128,
    q_lora_rank=1536,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    inter_dim=18432,
    moe_inter_dim=2048,
    n_routed_experts=256,
    n_shared_experts=1,
    n_groups=8,
    topk_groups=4,
    top_k=8,
    route_scale=2.5,
    ep_degree=8,
)

# Widths divided by 28 (hidden), 24 (q latent), 16 (kv latent), 4 (head dims), 32 (heads);
# experts 256 -> 16 in 4 groups keep 2, top-4; EP2 leaves 8 local experts.
DSV3_SMALL = MoELayerConfig(
    dim=256,
    n_heads=4,
    q_lora_rank=64,
    kv_lora_rank=32,
    qk_nope_head_dim=32,
    qk_rope_head_dim=16,
    v_head_dim=32,
    inter_dim=512,
    moe_inter_dim=64,
    n_routed_experts=16,
    n_shared_experts=1,
    n_groups=4,
    topk_groups=2,
    top_k=4,
    route_scale=2.5,
    ep_degree=2,
)


def dsv3_config(scale: Scale = "real", *, ep_degree: int | None = None) -> MoELayerConfig:
    """Return the DeepSeek-V3 layer config at ``scale``, optionally at another EP degree.

    Raises:
        ValueError: unknown scale, or an EP degree that does not divide the experts.
    """
    configs = {"real": DSV3_REAL, "small": DSV3_SMALL}
    if scale not in configs:
        raise ValueError(f"dsv3_config: unknown scale {scale!r}; choose one of {sorted(configs)}")
    config = configs[scale]
    if ep_degree is None:
        return config
    return dataclasses.replace(config, ep_degree=ep_degree)
