"""Step-0 probe inside the target: which device the run measures on, and the harness's spec."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ProbeRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    harness: str
    device: str = "auto"
    """"auto" picks cuda when a CUDA device is visible, else cpu."""


def probe_target_worker(request: dict) -> dict:
    """ProbeRequest -> {"device", "device_name", "torch", "cuda", "spec"}."""
    import torch

    from phases.kit.provenance import probe_device_name
    from phases.local_compile_perf.harness import HarnessSpecRecord, load_harness

    req = ProbeRequest.model_validate(request)
    device = req.device if req.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"--device {device} asked for, but torch {torch.__version__} sees no CUDA device")
    harness = load_harness(req.harness)
    return {"device": device, "device_name": probe_device_name() if device.startswith("cuda") else
            f"cpu ({probe_device_name()})", "torch": torch.__version__, "cuda": torch.version.cuda or "none",
            "spec": HarnessSpecRecord.from_spec(harness.spec).model_dump(mode="json")}
