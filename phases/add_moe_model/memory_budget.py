"""Will the numerics worker fit in this machine's memory? (engine side, no torch)

The synthetic entry keeps the real hidden and expert sizes (the skill's rule), so one MoE
layer of 8 experts can need tens of GiB (cohere2_moe: 8 x 3 x 8192 x 22528 weights). The
worker holds them several times over (the HF block and the Titan MoE, in bf16 and then in
fp32): ~8 bytes per weight is this module's estimate of the peak, not a measurement. A run
that would not fit is refused before it starts, with the numbers, instead of being
killed by the kernel's OOM killer, which may pick another process of a shared machine.
"""

from __future__ import annotations

from typing import Any

from phases.add_moe_model.work.config_fields import entry_expert_count

BYTES_PER_WEIGHT = 8
GIB = 1 << 30


def expert_weights(entry: dict[str, Any]) -> int:
    """Routed (and shared) expert weights of one MoE layer of the synthetic entry."""
    hidden = int(entry.get("hidden_size") or 0)
    inner = int(entry.get("moe_intermediate_size") or entry.get("intermediate_size") or 0)
    experts = entry_expert_count(entry) or 8
    shared = int(entry.get("n_shared_experts") or 0)
    return (experts + shared) * 3 * hidden * inner


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where there is no such file)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def memory_shortfall(entry: dict[str, Any]) -> str | None:
    """A sentence saying why the numerics worker would not fit, or None when it fits (or nobody knows)."""
    needed, free = expert_weights(entry) * BYTES_PER_WEIGHT, available_bytes()
    if free is None or needed <= free:
        return None
    return (f"numerics of {entry.get('model_type')} needs about {needed / GIB:.1f} GiB here (8 experts x 3 x "
            f"{entry.get('hidden_size')} x {entry.get('moe_intermediate_size') or entry.get('intermediate_size')} "
            f"weights, ~{BYTES_PER_WEIGHT} bytes each at the peak) but only {free / GIB:.1f} GiB is available: "
            "run it on a machine with more memory or on a GPU (--device cuda)")
