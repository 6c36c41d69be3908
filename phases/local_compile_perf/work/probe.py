"""Step-0 probe inside the target: which device the run measures on, and the harness's spec."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from phases.kit.harness import HarnessRequest


class TargetProbeRequest(HarnessRequest):
    device: str = "auto"
    """"auto" picks cuda when a CUDA device is visible, else cpu."""


class TargetProbe(BaseModel):
    """Answer of ``probe_target_worker``."""

    device: str
    device_name: str
    torch: str
    cuda: str
    spec: dict[str, Any]
    """The harness's ``HarnessSpec``."""


def probe_target_worker(request: dict) -> dict:
    """TargetProbeRequest -> {"device", "device_name", "torch", "cuda", "spec"}."""
    import torch

    from phases.kit.harness import load_harness
    from phases.kit.provenance import probe_device_name

    req = TargetProbeRequest.model_validate(request)
    device = req.device if req.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"--device {device} asked for, but torch {torch.__version__} sees no CUDA device")
    harness = load_harness(req.harness)
    return {"device": device, "device_name": probe_device_name() if device.startswith("cuda") else
            f"cpu ({probe_device_name()})", "torch": torch.__version__, "cuda": torch.version.cuda or "none",
            "spec": harness.spec.model_dump(mode="json")}
