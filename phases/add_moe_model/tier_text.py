"""The words for a numerics tier and its firmness, one place for every report that shows them.

The tier is always the verdict's own (PASS, WARN, FAIL); what the one-ulp spread reaches, and the
tokens a near-tie in the router sends to different experts, are said beside it, never as a tier.
"""

from __future__ import annotations

from typing import Any


def reaches(status: str, firm: dict[str, Any] | None) -> list[str]:
    """The other tiers KL +- one-ulp spread reaches ([] when it crosses no threshold)."""
    edge = (firm or {}).get("edge")
    return [tier for tier in edge.split("|") if tier != status] if edge else []


def tier_text(status: str, firm: dict[str, Any] | None) -> str:
    """"PASS", or "PASS (one-ulp spread reaches WARN)" when KL +- spread crosses a threshold."""
    other = reaches(status, firm)
    return f"{status} (one-ulp spread reaches {' and '.join(other)})" if other else status


def split_text(firm: dict[str, Any]) -> str:
    """"; 2 of 32 tokens carry it (routed differently on each side?), KL without them 3.1e-07"."""
    split = firm.get("split") or {}
    if not split.get("outlier_tokens"):
        return ""
    rest = split.get("kl_without_outliers")
    return (f"; {split['outlier_tokens']} of {split['tokens']} tokens carry it (routed differently on each side?)"
            + (f", KL without them {rest:.2e}" if rest is not None else ""))


def flip_text(firm: dict[str, Any]) -> str:
    """"; the one-ulp move routes 3 of 64 tokens differently on each side (KL then 2.07e-02)"."""
    flipped = firm.get("flipped")
    if not flipped:
        return ""
    moved = firm.get("kl_perturbed")
    return (f"; the one-ulp move routes {flipped['tokens']} of {flipped['of']} tokens differently on each side"
            + (f" (KL then {moved:.2e})" if moved is not None else ""))


def firmness_line(r: Any) -> str:
    """One row of the firmness table: KL, fp64 KL, spread, tier, and what the figures say about it."""
    firm = r.firmness or {}
    if "error" in firm:
        return str(firm["error"])
    spread = f"{firm['spread']:.2e}" if firm.get("spread") is not None else "-"
    other = (f"  {firm['other_kernel']} experts KL={firm['kl_other_kernel']:.2e}"
             if firm.get("kl_other_kernel") is not None
             else f"  other kernel: {firm['other_kernel']}" if firm.get("other_kernel") else "")
    return (f"KL={r.kl:.2e}  KL(fp64)={firm['kl_fp64']:.2e}  spread={spread}  tier {tier_text(r.status, firm)}"
            f"{split_text(firm).replace(';', ' ', 1)}{flip_text(firm).replace(';', ' ', 1)}{other}")


def diagnostic_reading(r: Any) -> str:
    """What a second-dtype comparison (the fp32 diagnostic) can say, from its KL, its max_diff and the dtypes its
    matmuls really ran in: "agrees" only where KL passes and max_diff is 0; a side whose matmuls ran below the
    dtype is named, with what that means for the reading."""
    from phases.add_moe_model.work.op_dtypes import describe_below

    if r.kl is None or r.max_diff is None:
        return f"{r.dtype} comparison not measured: {r.error or r.status}"
    if r.status == "PASS" and r.max_diff == 0.0:
        reading = f"agrees (KL {r.kl:.2e}, max_diff 0.00)"
    elif r.status == "PASS":
        reading = f"does not agree: KL {r.kl:.2e} passes, but max_diff {r.max_diff:.2e} is not 0"
    else:
        reading = f"differs: KL {r.kl:.2e} ({r.status}), max_diff {r.max_diff:.2e}"
    below = getattr(r, "matmuls_below_run_dtype", None) or {}
    sides = [f"{name}: {describe_below(below[key])}" for name, key in (("HF", "hf"), ("Titan", "titan"))
             if below.get(key)]
    if not sides:
        return f"{r.dtype} on both sides (every matmul measured in {r.dtype}): {reading}"
    return (f"{r.dtype} comparison {reading}; NOT {r.dtype} on both sides ({'; '.join(sides)}): its gap includes "
            f"that lower-precision rounding, so it can neither clear nor convict the router or any other stage "
            "(the gap analysis' stage trace measures the stages apart)")
