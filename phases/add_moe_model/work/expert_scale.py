"""The factor an HF MoE block multiplies its experts' output by, measured.

Most routers hand the experts weights that already carry the model's routed scaling; some blocks (BEAM)
hand them the bare weights and scale the experts' output afterwards. Titan's router scales the weights
(``route_scale``), so a comparison of routing weights must give HF's weights that factor, or it reports
a difference that the whole block does not have. The factor is measured, not read from the config: the
block runs again with its experts' output doubled, and its output moves by the factor times that output.
"""

from __future__ import annotations

from typing import Any, Callable

AFFINE_TOLERANCE = 1e-3
"""Largest relative residual of (moved output - factor x experts' output) for the block to count as affine in it."""


def factor_after_experts(experts: Any, run: Callable[[], Any]) -> float | None:
    """``run()`` runs the block once (in fp32 for a clean reading); None where ``experts`` is missing, its output
    is not one tensor, or the block's output is not affine in it (a norm after the experts, say)."""
    import torch

    if experts is None:
        return None
    kept: dict[str, Any] = {}

    def keep(_module: Any, _args: tuple, out: Any) -> None:
        kept.setdefault("experts", out)

    def double(_module: Any, _args: tuple, out: Any) -> Any:
        return out * 2 if torch.is_tensor(out) else None

    outputs = []
    for hook in (keep, double):
        handle = experts.register_forward_hook(hook)
        try:
            with torch.no_grad():
                out = run()
        finally:
            handle.remove()
        outputs.append(out[0] if isinstance(out, tuple) else out)
    made = kept.get("experts")
    if not torch.is_tensor(made) or not all(torch.is_tensor(o) and o.numel() == made.numel() for o in outputs):
        return None
    made, moved = made.double().flatten(), (outputs[1] - outputs[0]).double().flatten()
    if not bool(made.abs().sum() > 0):
        return None
    factor = float(moved @ made / (made @ made))
    if not bool((moved - factor * made).norm() <= AFFINE_TOLERANCE * moved.norm()):
        return None
    short = float(f"{factor:.4g}")  # 2.5, not 2.4999998: a config's factor, read through fp32 rounding
    return short if abs(short - factor) <= 1e-5 * abs(factor) else factor


def hf_factor_after_experts(bench: Any, *, device: Any) -> float | None:
    """The factor HF's MoE part multiplies its experts' output by (``factor_after_experts``), measured in fp32."""
    import torch

    from phases.add_moe_model.work import numerics

    def run() -> Any:
        return numerics.run_hf_side(bench.site, hidden=bench.config.hidden_size, dtype=torch.float32, device=device,
                                    seed=bench.seed)[0]

    return factor_after_experts(bench.site.experts, run)


def scaled_weights(hf: dict[str, Any]) -> Any:
    """HF's routing weights times the factor its block applies after the experts: what Titan's router gives."""
    weights = hf["routing"]["weights"]
    return weights if hf["factor"] == 1.0 else weights * hf["factor"]


def scaled_note(hf: dict[str, Any]) -> str:
    return "" if hf["factor"] == 1.0 else (f" (HF's weights x{hf['factor']:.4g}, the factor its block applies after "
                                            "its experts, measured)")
