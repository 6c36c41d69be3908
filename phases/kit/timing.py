"""Step timing: one screen, sync discipline, warm-up kept apart, every sample kept.

On CUDA each timed iteration sits between its own pair of CUDA events (so a single slow
iteration is visible, not averaged away) and the device is synchronized before the first
and after the last. On a CPU host the same loop uses ``time.perf_counter`` and the result
says ``timer="host"``. The first warm-up call is timed on its own as ``compile_ms``: with
regions enabled it is the compile, which must never leak into the samples. Peak memory is
reset before the timed loop and read after it (CUDA only).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

from phases.kit.records import NotApplicable, PeakMemory, Timing

if TYPE_CHECKING:
    import torch


def is_cuda(device: "str | torch.device") -> bool:
    """True when ``device`` names a CUDA device ("cuda", "cuda:0")."""
    return str(device).startswith("cuda")


def sync(device: "str | torch.device") -> None:
    """Wait for queued device work (no-op on CPU)."""
    import torch

    if is_cuda(device):
        torch.cuda.synchronize(device)


def reset_peak_memory(device: "str | torch.device") -> None:
    import torch

    if is_cuda(device):
        torch.cuda.reset_peak_memory_stats(device)


def read_peak_memory(device: "str | torch.device") -> PeakMemory | NotApplicable:
    """``max_memory_allocated`` since the last reset, or NotApplicable off CUDA."""
    import torch

    if not is_cuda(device):
        return NotApplicable(reason=f"peak memory is a CUDA allocator statistic; device is {device}")
    return PeakMemory(bytes=int(torch.cuda.max_memory_allocated(device)))


def time_first_call(step: Callable[[], object], *, device: str) -> float:
    """Wall ms of one call including its compile, synchronized on both sides."""
    sync(device)
    t0 = time.perf_counter()
    step()
    sync(device)
    return (time.perf_counter() - t0) * 1e3


def measure_step(
    step: Callable[[], object], *, warmup: int = 5, iters: int = 20, device: str
) -> Timing:
    """Time ``iters`` calls of ``step`` after ``warmup`` calls.

    Args:
        step: one fwd+bwd (or any unit of work); its result is ignored.
        warmup: calls before timing; the first is timed apart as ``compile_ms``.
        iters: timed calls, one sample each.
        device: where the work runs; "cuda..." uses CUDA events, anything else host timers.

    Returns:
        Timing with every sample, the timer used, compile_ms and peak memory.
    """
    if warmup < 1 or iters < 1:
        raise ValueError(f"measure_step: warmup ({warmup}) and iters ({iters}) must be >= 1")
    compile_ms = time_first_call(step, device=device)
    for _ in range(warmup - 1):
        step()
    sync(device)
    reset_peak_memory(device)
    samples = time_cuda_events(step, iters=iters) if is_cuda(device) else time_host(step, iters=iters)
    return Timing(
        samples_ms=samples,
        warmup=warmup,
        timer="cuda_events" if is_cuda(device) else "host",
        compile_ms=compile_ms,
        peak_memory=read_peak_memory(device),
        device=str(device),
    )


def time_cuda_events(step: Callable[[], object], *, iters: int) -> tuple[float, ...]:
    """Per-iteration ms from CUDA event pairs; one synchronize at the end."""
    import torch

    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    torch.cuda.synchronize()
    for start, end in events:
        start.record()
        step()
        end.record()
    torch.cuda.synchronize()
    return tuple(float(start.elapsed_time(end)) for start, end in events)


def time_host(step: Callable[[], object], *, iters: int) -> tuple[float, ...]:
    """Per-iteration ms from ``time.perf_counter`` (CPU work is synchronous)."""
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        samples.append((time.perf_counter() - t0) * 1e3)
    return tuple(samples)


def time_batch(call: Callable[[], object], reps: int, *, cuda: bool) -> float:
    """Seconds for ``reps`` back-to-back calls: one CUDA event pair around them all (device synchronized on
    both sides), or ``time.perf_counter`` on a host. For throughput probes (bandwidth, GEMM rate), not steps."""
    if not cuda:
        t0 = time.perf_counter()
        for _ in range(reps):
            call()
        return time.perf_counter() - t0
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        call()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3
