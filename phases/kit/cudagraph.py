"""Whole fwd+bwd CUDA-graph replay: the second row of every comparison.

Replay removes host launch time, so a win that vanishes here was host time. The step is
warmed on a side stream (as capture requires), captured once with ``torch.cuda.graph``,
then each replay is timed between its own CUDA events. Setting grads to None inside the
captured step is fine: the capture records the kernels the step runs, and comparisons are
captured vs captured. Off CUDA this returns NotApplicable, never a host-timed stand-in.
"""

from __future__ import annotations

from typing import Callable

from phases.kit.records import NotApplicable, Timing
from phases.kit.timing import is_cuda, read_peak_memory, reset_peak_memory


def measure_cuda_graph_replay(
    step: Callable[[], object], *, warmup: int = 3, iters: int = 20, device: str = "cuda"
) -> Timing | NotApplicable:
    """Capture one ``step`` in a CUDA graph and time ``iters`` replays.

    Args:
        step: one fwd+bwd; must be capturable (no host syncs, static shapes).
        warmup: eager calls on a side stream before capture.
        iters: timed replays, one sample each.
        device: "cuda..."; anything else, or no CUDA runtime, gives NotApplicable.

    Returns:
        Timing(timer="cuda_graph_replay"), or NotApplicable with the reason (including a
        capture failure, whose error text is kept).
    """
    import torch

    if not is_cuda(device) or not torch.cuda.is_available():
        return NotApplicable(reason="no CUDA device")
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(side)
    try:
        with torch.cuda.graph(graph):
            step()
    except RuntimeError as err:
        return NotApplicable(reason=f"capture failed: {str(err).splitlines()[0][:300]}")
    graph.replay()
    torch.cuda.synchronize()
    reset_peak_memory(device)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return Timing(
        samples_ms=tuple(float(s.elapsed_time(e)) for s, e in events),
        warmup=warmup,
        timer="cuda_graph_replay",
        compile_ms=None,
        peak_memory=read_peak_memory(device),
        device=str(device),
    )
