"""Memory bandwidth probe: the denominator of every ideal time.

One large uint8 copy, warmed up, then a batch of timed copies; each copy reads and writes
the buffer once, so TB/s = 2 * bytes * copies / seconds / 1e12. It is measured on the GPU
in hand (spec sheets overstate what kernels reach) and recorded once per GPU. On a CPU
host the same copy measures host memcpy on a smaller buffer and is labelled as such: it
is not an HBM number and must not be used as one.
"""

from __future__ import annotations


from pydantic import BaseModel, ConfigDict

from phases.kit.records import Bandwidth
from phases.kit.timing import is_cuda, time_batch

HBM_BYTES = 2**30
HOST_BYTES = 2**26
"""64 MiB: large enough to leave the caches, small enough for a shared CPU host."""


def measure_bandwidth(device: str, *, warmup: int = 3, copies: int = 20, nbytes: int | None = None) -> Bandwidth:
    """Copy bandwidth of ``device`` in TB/s (read + write).

    Args:
        device: "cuda..." measures HBM with CUDA events; else host memcpy.
        warmup: untimed copies first.
        copies: timed copies.
        nbytes: buffer size; defaults to 1 GiB on CUDA and 64 MiB on a host.

    Returns:
        Bandwidth with the inputs of the formula next to the result.
    """
    import torch

    cuda = is_cuda(device)
    nbytes = nbytes or (HBM_BYTES if cuda else HOST_BYTES)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(warmup):
        dst.copy_(src)
    seconds = time_batch(lambda: dst.copy_(src), copies, cuda=cuda)
    return Bandwidth(
        tbs=2 * nbytes * copies / seconds / 1e12,
        nbytes=nbytes,
        copies=copies,
        seconds=seconds,
        warmup=warmup,
        kind="hbm" if cuda else "host_memcpy",
        label=_label(device),
    )


def _label(device: str) -> str:
    import torch

    if is_cuda(device):
        return f"HBM copy on {torch.cuda.get_device_name(device)}"
    return "host memcpy (no CUDA device): not an HBM bandwidth"


class BandwidthRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    device: str = "cuda"
    warmup: int = 3
    copies: int = 20


def bandwidth_worker(request: dict) -> dict:
    """Worker entry ``phases.kit.bandwidth:bandwidth_worker``: BandwidthRequest -> Bandwidth."""
    req = BandwidthRequest.model_validate(request)
    return measure_bandwidth(req.device, warmup=req.warmup, copies=req.copies).model_dump(mode="json")
