"""Screen variants interleaved in one process, rotating the order every round.

Interleaving keeps slow drifts (other jobs, clocks, a warming host) from landing on one
variant, and rotation keeps any variant from always running first or second with warm
caches. A screen ranks variants; it is never a cited number (confirm.py does those). Each
variant's first call is made before round one so compiles stay out of the samples.
"""

from __future__ import annotations

from typing import Callable, Mapping

from phases.kit.records import ScreenResult
from phases.kit.timing import is_cuda, sync, time_cuda_events, time_host


def rotated_orders(names: list[str], rounds: int) -> tuple[tuple[str, ...], ...]:
    """Round r runs ``names`` rotated left by r."""
    n = len(names)
    return tuple(tuple(names[(r + i) % n] for i in range(n)) for r in range(rounds))


def screen_variants(
    variants: Mapping[str, Callable[[], object]],
    *,
    rounds: int = 3,
    warmup: int = 3,
    iters: int = 10,
    device: str,
) -> ScreenResult:
    """Time each variant ``iters`` times per round for ``rounds`` rounds, order rotated.

    Args:
        variants: name -> step; a step that needs its own region binding binds it itself.
        rounds: rounds; each round times every variant once (after ``warmup`` calls).
        warmup: calls before each variant's timed block in every round.
        iters: timed calls per variant per round.
        device: "cuda..." for CUDA events, else host timers.

    Returns:
        ScreenResult with every sample per variant and the order of each round.
    """
    if len(variants) < 2:
        raise ValueError(f"screen_variants: need at least 2 variants, got {list(variants)}")
    timer = time_cuda_events if is_cuda(device) else time_host
    for step in variants.values():
        step()
    orders = rotated_orders(list(variants), rounds)
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for order in orders:
        for name in order:
            for _ in range(warmup):
                variants[name]()
            sync(device)
            samples[name].extend(timer(variants[name], iters=iters))
    return ScreenResult(
        samples_ms={k: tuple(v) for k, v in samples.items()},
        orders=orders,
        timer="cuda_events" if is_cuda(device) else "host",
        device=str(device),
    )
