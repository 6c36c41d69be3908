"""Attention against its FLOP floor: what one step's attention must compute, and the rate to compute it at.

``count_attention`` runs one step and counts every ``scaled_dot_product_attention`` call's matmul FLOPs
from its shapes: QK^T and PV forward, twice that backward (dV, dP, dQ, dK), counting only the (query,
key) pairs a causal mask keeps. The floor is those FLOPs at the GEMM rate measured on this device
(``measure_gemm_rate``: one large square matmul in the harness dtype, as bandwidth is measured, never a
spec sheet). Which backend ran (flash, efficient, cuDNN, math) is what the profile's kernel names show.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict

from phases.kit.records import AttentionCount, GemmRate
from phases.kit.timing import is_cuda, time_batch

BACKWARD_FACTOR = 2
"""Backward matmuls per forward matmul: dV = P^T dO and dP = dO V^T for PV; dQ = dS K and dK = dS^T Q for QK^T."""


@dataclass(frozen=True, slots=True)
class AttentionCall:
    q: tuple[int, ...]
    k: tuple[int, ...]
    v: tuple[int, ...]
    causal: bool
    masked: bool
    flops: int


def causal_pairs(s_q: int, s_k: int) -> int:
    """(query, key) pairs a causal mask keeps, queries aligned to the end of the keys (as SDPA does)."""
    offset = s_k - s_q
    return sum(min(max(i + offset + 1, 0), s_k) for i in range(s_q))


def attention_flops(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...], *, causal: bool) -> int:
    """Forward matmul FLOPs of one attention call on (..., heads, seq, dim) q/k/v; GQA broadcasts k and v."""
    *batch, heads, s_q, d_qk = q
    s_k, d_v = k[-2], v[-1]
    pairs = causal_pairs(s_q, s_k) if causal else s_q * s_k
    groups = 1
    for n in batch:
        groups *= n
    return 2 * groups * heads * pairs * (d_qk + d_v)


def count_attention(step: Callable[[], object]) -> AttentionCount:
    """Run ``step`` once and count every ``scaled_dot_product_attention`` call (forward; backward derived).

    Counted at the Python API (a torch function mode), so every backend SDPA may pick is seen, the math
    fallback included; which backend ran is for the profile's kernel names to say.
    """
    import torch
    from torch.overrides import TorchFunctionMode

    sdpa = torch.nn.functional.scaled_dot_product_attention
    calls: list[AttentionCall] = []

    class Spy(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            kwargs = kwargs or {}
            if func is sdpa:
                calls.append(_call(args, kwargs))
            return func(*args, **kwargs)

    with Spy():
        step()
    forward = sum(c.flops for c in calls)
    return AttentionCount(calls=len(calls), shapes=tuple(sorted(set(_shapes(calls)))), flops_fwd=forward,
                          flops_fwdbwd=forward * (1 + BACKWARD_FACTOR))


def _call(args: tuple, kwargs: dict) -> AttentionCall:
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
    bound = {**dict(zip(names, args)), **kwargs}
    q, k, v = (tuple(bound[n].shape) for n in ("query", "key", "value"))
    causal = bool(bound.get("is_causal")) and bound.get("attn_mask") is None
    return AttentionCall(q=q, k=k, v=v, causal=causal, masked=bound.get("attn_mask") is not None,
                         flops=attention_flops(q, k, v, causal=causal))


def _shapes(calls: list[AttentionCall]) -> list[str]:
    return [f"q{list(c.q)} k{list(c.k)} v{list(c.v)} " + ("causal" if c.causal else "mask" if c.masked else "full")
            for c in calls]


def measure_gemm_rate(device: str, dtype: Any, *, size: int | None = None, warmup: int = 2,
                      min_seconds: float = 0.5) -> GemmRate:
    """FLOP/s of a ``size``-cubed matmul in ``dtype`` on ``device`` (8192 on CUDA, 256 on a host), repeated
    until ``min_seconds`` have passed (a host's bf16 matmul can take a tenth of a second at 256)."""
    import torch

    cuda = is_cuda(device)
    n = size or (8192 if cuda else 256)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(warmup):
        a @ b
    reps, seconds = 0, 0.0
    while seconds < min_seconds and reps < 1000:
        batch = max(reps, 1)
        seconds += time_batch(lambda: a @ b, batch, cuda=cuda)
        reps += batch
    where = torch.cuda.get_device_name(device) if cuda else "the host CPU (no CUDA device)"
    name = str(dtype).removeprefix("torch.")
    return GemmRate(tflops=2 * n**3 * reps / seconds / 1e12, size=n, reps=reps, seconds=seconds, dtype=name,
                    label=f"{n}^3 {name} matmul on {where}")


class GemmRateRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    device: str = "cuda"
    dtype: str = "bf16"


def gemm_rate_worker(request: dict) -> dict:
    """Worker entry ``phases.kit.attention:gemm_rate_worker``: GemmRateRequest -> GemmRate."""
    from phases.kit.harness import resolve_dtype

    req = GemmRateRequest.model_validate(request)
    return measure_gemm_rate(req.device, resolve_dtype(req.dtype)).model_dump(mode="json")
