"""Phase 3b worker: the skill's pretrained test on a local checkpoint (``--weights DIR``).

The checkpoint is loaded whole in bf16 as the skill's pretrained script loads it (its own
config, grouped_mm experts where the model class allows it), then its first MoE block is
compared with the target's Titan MoE exactly as the synthetic comparison does
(``work/numerics.py``: the one allowed fp32 gate cast, x = randn(2, 16, H), the target's
probe, build and adapter, the token layout the target's MoE takes). The tier is the
skill's for pretrained weights: PASS below KL 1e-3, else FAIL (no WARN tier).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from phases.add_moe_model.work.numerics import LoadReport

PRETRAINED_KL = 1e-3
DTYPE = "bfloat16"


class PretrainedRequest(BaseModel):
    weights: str
    device: Literal["cpu", "cuda", "auto"] = "auto"
    seed: int = 42


class PretrainedResult(BaseModel):
    """One checkpoint's comparison; ``model`` is the directory's name, as the skill's script prints it."""

    model: str
    weights: str
    model_type: str = ""
    dtype: str = DTYPE
    device: str = ""
    device_note: str = ""
    status: Literal["PASS", "FAIL", "SKIP", "ERROR"]
    kl: float | None = None
    cos_sim: float | None = None
    max_diff: float | None = None
    mean_diff: float | None = None
    threshold: float = PRETRAINED_KL
    layer_index: int | None = None
    hidden_size: int | None = None
    num_experts: int | None = None
    hf_experts_impl: str = ""
    moe_layout: str = ""
    load: LoadReport = Field(default_factory=LoadReport)
    error: str | None = None
    error_type: str | None = None
    error_origin: str | None = None
    error_frame: str | None = None
    versions: dict[str, str] = Field(default_factory=dict)
    seed: int
    seconds: dict[str, float] = Field(default_factory=dict)


def classify_pretrained(kl: float) -> str:
    """The skill's 3b tier: PASS below 1e-3, else FAIL (a NaN KL is a FAIL)."""
    return "PASS" if kl < PRETRAINED_KL else "FAIL"


def compare_pretrained(request: dict[str, Any]) -> dict[str, Any]:
    """Request ``PretrainedRequest``, answer ``PretrainedResult``; any exception is an ERROR row."""
    from phases.add_moe_model.work.error_origin import error_origin
    from phases.add_moe_model.work.error_origin import describe_error

    req = PretrainedRequest.model_validate(request)
    base = {"model": Path(req.weights).name, "weights": req.weights, "seed": req.seed}
    try:
        return PretrainedResult(**base, **compare_checkpoint(req)).model_dump()
    except Exception as exc:  # noqa: BLE001 - every failure must become an ERROR row
        origin, frame = error_origin(exc)
        return PretrainedResult(**base, status="ERROR", error=describe_error(exc), error_type=type(exc).__name__,
                                error_origin=origin, error_frame=frame).model_dump()


def compare_checkpoint(req: PretrainedRequest) -> dict[str, Any]:
    import torch

    from phases.add_moe_model.work import moe_blocks
    from phases.add_moe_model.work.layout import detect_moe_layout
    from phases.add_moe_model.work.kl import measure_output_gap
    from phases.add_moe_model.work.numerics import collect_versions, resolve_device, run_hf_side

    t0 = time.perf_counter()
    device, note = resolve_device(req.device)
    model, config, hf_impl = load_checkpoint(req.weights)
    seconds = {"load": round(time.perf_counter() - t0, 3)}
    fields = {"model_type": config.model_type, "device": device, "device_note": note, "hf_experts_impl": hf_impl,
              "hidden_size": config.hidden_size, "versions": collect_versions(), "seconds": seconds}
    site = moe_blocks.find_moe_site(model)
    if site is None:
        return {**fields, "status": "SKIP", "error": "no MoE layer in the checkpoint's model"}
    dt, dev = getattr(torch, DTYPE), torch.device(device)
    t1 = time.perf_counter()
    hf_out, x = run_hf_side(site, hidden=config.hidden_size, dtype=dt, device=dev, seed=req.seed)
    params = moe_blocks.probe_moe_params(site, config)
    if site.kind == "layer":
        params = {**params, "shared_expert_info": None}  # routed experts only, as on the HF side
    titan = moe_blocks.build_titan_moe(params, config, device=dev, dtype=dt)
    load = moe_blocks.load_through_adapter(titan, site)
    layout = detect_moe_layout(titan, hidden=config.hidden_size)
    with torch.no_grad():
        tt_out = titan(layout.tokens(x))
    seconds["compare"] = round(time.perf_counter() - t1, 3)
    metrics = measure_output_gap(hf_out.reshape(tt_out.shape), tt_out)
    status = metrics.pop("status")
    if metrics["kl"] is not None:
        status = classify_pretrained(metrics["kl"])
    return {**fields, **metrics, "status": status, "layer_index": site.layer_index,
            "num_experts": params.get("num_experts"), "load": LoadReport(**load),
            "moe_layout": f"{layout.name}: {layout.evidence}"}


def load_checkpoint(folder: str) -> tuple[Any, Any, str]:
    """The checkpoint's model in bf16 (eval) on the CPU; the caller moves the MoE part it compares."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from phases.add_moe_model.work import moe_blocks

    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    model_cls = AutoModelForCausalLM._model_mapping[type(config)]
    hf_impl = moe_blocks.set_experts_impl(config, model_cls=model_cls)
    model = AutoModelForCausalLM.from_pretrained(folder, config=config, dtype=torch.bfloat16, local_files_only=True)
    return model.eval(), config, hf_impl
