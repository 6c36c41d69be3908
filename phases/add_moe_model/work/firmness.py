"""How firm a KL tier is: the same KL in float64, and its spread under a one-ulp input change.

The skill's KL (one softmax over every output element, summed in fp32) is the verdict; at
the 1e-6 level its own rounding is of the size of the PASS threshold (fp32 diagnostics of
healthy models report negative KLs). Two figures say how much to trust the tier:
- ``kl_fp64``: the same formula on the same outputs, computed in float64 (``kl.measure_output_gap``);
- ``spread``: |KL(x') - KL(x)| with x' = x moved by one ulp (``nextafter`` towards +inf in
  the run dtype), both sides re-run: the noise band of the comparison itself, as
  local-compile-perf's correctness check uses;
- ``kl_other_kernel``: the same KL with HF's experts on the other kernel choice (``eager``
  for ``grouped_mm`` and back), where the model's experts take a settable implementation;
  ``None`` where they do not (``other_kernel`` says which ran, or why none).
- ``split``: how many tokens carry the gap (per-token relative error at least 10x the median) and
  the KL without them. A few such tokens are tokens routed to different experts on each side
  (a near-tie in the router), and a one-ulp change flips them: the spread is then their flip.
The tier is always the KL's own. ``edge`` ("PASS|WARN") names the tiers KL +- spread reaches, when
it crosses a threshold: a PASS there takes the safe side (gap analysis runs). When a few outlier
tokens carry the KL, or appear under the one-ulp move (``flipped``), there is no edge: the spread is
their routing flip, and the split or ``flipped`` counts them. Thresholds and the verdict formula stay
those of ``work/kl.py``, which the verdict (``work/numerics.py``) uses too.
"""

from __future__ import annotations

from typing import Any

from phases.add_moe_model.work.error_origin import describe_error
from phases.add_moe_model.work.kl import cast_float_inputs_to_fp32, classify_kl, hf_moe_forward, measure_output_gap


def measure_firmness(site: Any, titan: Any, x: Any, hf_out: Any, tt_out: Any, *, kl: float,
                     layout: Any) -> dict[str, Any]:
    """{"kl_fp64", "kl_perturbed", "spread", "edge"} for one dtype's comparison.

    ``x`` is (B, L, D) as the HF side takes it; ``layout`` (work/layout.py) gives it to the
    target's MoE in the shape that MoE takes, as the verdict's own forward did.
    """
    import torch

    moved = torch.nextafter(x, torch.full_like(x, float("inf")))
    with torch.no_grad():
        hf_moved = hf_forward_fp32_router(site, moved)
        tt_moved = titan(layout.tokens(moved))
    hf_moved = hf_moved.reshape(tt_moved.shape)
    kl_moved = measure_output_gap(hf_moved, tt_moved)["kl"]
    spread = abs(kl_moved - kl) if kl_moved is not None else None
    split, moved_split = token_split(hf_out, tt_out), token_split(hf_moved, tt_moved)
    kl_fp64 = measure_output_gap(hf_out, tt_out, dtype="float64")["kl"]
    return {"kl_fp64": kl_fp64, "kl_perturbed": kl_moved, "spread": spread, "split": split,
            **judge_edge(kl, spread, split, moved_split, classify=classify_kl), **other_kernel_kl(site, x, tt_out)}


def judge_edge(kl: float, spread: float | None, split: dict[str, Any], moved_split: dict[str, Any], *,
               classify: Any) -> dict[str, Any]:
    """{"edge", "flipped"}: the tiers KL +- spread reaches, unless a few tokens' routing carries the spread.

    A few outlier tokens on either input are tokens a near-tie in the router sends to different
    experts on each side; the one-ulp move flips them, so the spread measures their flip, not the
    noise around one tier. ``flipped`` then counts them on the moved input.
    """
    flipped = None
    if moved_split["outlier_tokens"] > split["outlier_tokens"]:
        flipped = {"tokens": moved_split["outlier_tokens"], "of": moved_split["tokens"]}
    if spread is None or split["outlier_tokens"] or flipped:
        return {"edge": None, "flipped": flipped}
    low, high = classify(kl - spread), classify(kl + spread)
    return {"edge": f"{low}|{high}" if low != high else None, "flipped": None}


OUTLIER_FACTOR = 10.0


def token_split(hf_out: Any, tt_out: Any) -> dict[str, Any]:
    """Tokens whose relative error is >= 10x the median (and above 1e-3), and the KL of the others."""
    hf = hf_out.double().reshape(-1, hf_out.shape[-1])
    tt = tt_out.double().reshape(-1, tt_out.shape[-1])
    err = (hf - tt).norm(dim=-1) / hf.norm(dim=-1).clamp_min(1e-30)
    outliers = (err >= OUTLIER_FACTOR * err.median()) & (err > 1e-3)
    kept = ~outliers
    rest = None
    if bool(outliers.any()) and bool(kept.any()):
        rest = measure_output_gap(hf[kept], tt[kept], dtype="float64")["kl"]
    return {"tokens": int(err.numel()), "outlier_tokens": int(outliers.sum()), "kl_without_outliers": rest}


OTHER_KERNEL = {"grouped_mm": "eager", "eager": "grouped_mm"}


def other_kernel_kl(site: Any, x: Any, tt_out: Any) -> dict[str, Any]:
    """{"other_kernel", "kl_other_kernel"}: the HF side re-run with its experts on the other kernel."""
    configs = {id(m.config): m.config for m in site.block.modules()
               if getattr(getattr(m, "config", None), "_experts_implementation", None) in OTHER_KERNEL}
    if not configs:
        return {"other_kernel": "none: the experts take no settable implementation", "kl_other_kernel": None}
    ran = {c._experts_implementation for c in configs.values()}
    other = OTHER_KERNEL[sorted(ran)[0]]
    for config in configs.values():
        config._experts_implementation = other
    try:
        import torch

        with torch.no_grad():
            hf_other = hf_forward_fp32_router(site, x)
        kl = measure_output_gap(hf_other.reshape(tt_out.shape), tt_out)["kl"]
        return {"other_kernel": other, "kl_other_kernel": kl}
    except Exception as exc:  # noqa: BLE001 - a kernel the model cannot run is a recorded answer, not a crash
        return {"other_kernel": f"{other}: {describe_error(exc)}", "kl_other_kernel": None}
    finally:
        for config in configs.values():
            config._experts_implementation = sorted(ran)[0]


def hf_forward_fp32_router(site: Any, x: Any) -> Any:
    """The HF side exactly as the verdict ran it (router inputs cast to fp32), on another input."""
    handle = site.router.register_forward_pre_hook(cast_float_inputs_to_fp32)
    try:
        return hf_moe_forward(site, x)
    finally:
        handle.remove()
