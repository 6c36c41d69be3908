"""How firm a KL tier is: the same KL in float64, and its spread under a one-ulp input change.

The skill's KL (one softmax over every output element, summed in fp32) is the verdict; at
the 1e-6 level its own rounding is of the size of the PASS threshold (fp32 diagnostics of
healthy models report negative KLs). Two figures say how much to trust the tier:
- ``kl_fp64``: the same formula on the same outputs, computed in float64;
- ``spread``: |KL(x') - KL(x)| with x' = x moved by one ulp (``nextafter`` towards +inf in
  the run dtype), both sides re-run: the noise band of the comparison itself, as
  local-compile-perf's correctness check uses.
A tier that KL +- spread crosses is ``edge`` ("PASS|WARN"): the workflow then takes the safe
side (gap analysis runs). Thresholds and the verdict formula stay those of ``numerics``.
"""

from __future__ import annotations

from typing import Any


def kl_fp64(hf_out: Any, tt_out: Any) -> float:
    import torch.nn.functional as F

    hf, tt = hf_out.double().flatten().unsqueeze(0), tt_out.double().flatten().unsqueeze(0)
    return F.kl_div(F.log_softmax(tt, dim=-1), F.softmax(hf, dim=-1), reduction="batchmean").item()


def measure_firmness(site: Any, titan: Any, x: Any, hf_out: Any, tt_out: Any, *, kl: float) -> dict[str, Any]:
    """{"kl_fp64", "kl_perturbed", "spread", "edge"} for one dtype's comparison."""
    import torch

    from phases.add_moe_model.work.numerics import classify_kl, measure_output_gap

    moved = torch.nextafter(x, torch.full_like(x, float("inf")))
    with torch.no_grad():
        hf_moved = hf_forward_fp32_router(site, moved)
        tt_moved = titan(moved)
    kl_moved = measure_output_gap(hf_moved.reshape(tt_moved.shape), tt_moved)["kl"]
    spread = abs(kl_moved - kl) if kl_moved is not None else None
    edge = None
    if spread is not None:
        low, high = classify_kl(kl - spread), classify_kl(kl + spread)
        edge = f"{low}|{high}" if low != high else None
    return {"kl_fp64": kl_fp64(hf_out, tt_out), "kl_perturbed": kl_moved, "spread": spread, "edge": edge}


def hf_forward_fp32_router(site: Any, x: Any) -> Any:
    """The HF side exactly as the verdict ran it (router inputs cast to fp32), on another input."""
    from phases.add_moe_model.work.numerics import cast_float_inputs_to_fp32, hf_moe_forward

    handle = site.router.register_forward_pre_hook(cast_float_inputs_to_fp32)
    try:
        return hf_moe_forward(site, x)
    finally:
        handle.remove()
