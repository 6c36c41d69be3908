"""Whether a step's times add up: parts at most their total, kernel total about the wall.

"Per step" must mean per step: family (or glue) times add up to at most the kernel total, and that
to about the wall, or the report says why not. Both the profile tables and the baselines table ask.
"""

from __future__ import annotations

from typing import Any, Iterable

TOLERANCE = 1.1
"""Kernel total within this factor of the wall (either way) counts as "about the wall"."""
LOADED = 1.0
"""Load average above the host's CPU count by more than this: other processes shared the CPUs."""


def reading(*, kernel: float, wall: float, cuda: bool, parts: float | None = None, parts_name: str = "family times",
            medians: bool = False) -> dict[str, Any]:
    """``holds`` and, when it does not, ``why`` in words with the likely reason.

    ``medians``: the numbers are medians of each column taken separately (several processes), so a
    part can exceed its total by the spread between processes alone.
    """
    ratio = kernel / wall
    why = []
    if parts is not None and parts > kernel * 1.001:
        why.append(f"{parts_name} {parts:.3f} ms > kernel total {kernel:.3f} ms: " + (
            "each column is a median over fresh processes, taken separately" if medians else
            "the table counts some time twice"))
    if ratio > TOLERANCE:
        why.append(f"the kernel total is {ratio:.2f}x the wall: " + (
            "kernels on several streams overlap" if cuda else
            "host ops timed by self CPU time under the profiler, whose steps ran slower than the timed ones "
            "(profiler overhead per op, and a shared host's load moves between the two)"))
    elif ratio < 1 / TOLERANCE:
        why.append(f"kernels cover {ratio:.0%} of the wall: the rest is " + (
            "device idle (launch gaps, host work)" if cuda else
            "host time outside aten ops (Python, the autograd engine, compiled code)"))
    return {"kernel_ms": kernel, "wall_ms": wall, "kernel_over_wall": ratio, "holds": not why, "why": "; ".join(why)}


def cited_why(cited: dict[str, float], *, cuda: bool) -> str:
    """Why a cell's cited glue, kernel and wall medians do not add up ("" when they do)."""
    return reading(kernel=cited["kernel_ms"], wall=cited["wall_ms"], cuda=cuda, parts=cited["glue_ms"],
                   parts_name="glue", medians=True)["why"]


def highest_load(loads: Iterable[float | None]) -> float | None:
    """The highest of the host loads sampled (None where none was)."""
    return max((load for load in loads if load is not None), default=None)


def host_load_note(load: float | None, cpus: int | None) -> str:
    """One line on the host's load while timing, or "" where it was not sampled."""
    if load is None or not cpus:
        return ""
    note = f"host load while timing: 1-minute load average up to {load:.1f} on {cpus} CPUs (the timed process's " \
           "own threads count too)"
    if load > cpus + LOADED:
        note += ": other processes shared the CPUs, so timings are noisier than the noise bands of a quiet host"
    return note
