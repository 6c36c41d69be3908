"""Phase 3a worker: the unmodified HF MoE block against the target's Titan MoE.

Runs in a worker subprocess of the target's Python (``ctx.call(NUMERICS, ...)``), so the
Titan side is whatever the target checkout builds today: its probe, its
``_build_moe_config`` and its state-dict adapter, used as they are (a converter bug
must show). The HF side runs unmodified except for the one cast the skill allows: the
router/gate in fp32 with a pre-hook casting its inputs to fp32.

Design choices:
- Thresholds are constants of ``work/kl.py``, never read from the target; so are the KL and the HF
  forward, which firmness (``work/firmness.py``) runs again on a moved input.
- ``compare`` answers for one dtype (the skill's contract). ``compare_dtypes`` runs
  several dtypes on one HF model in one process, so the ~12 s torchtitan import is paid
  once; the phase uses it for the bf16 verdict plus the fp32 diagnostic.
- The HF model is built once in the first requested dtype and the MoE part is cast
  for each run, so every dtype sees the same weights (bf16-representable when bf16
  comes first): a difference between the runs is compute precision, not weights.
- Torch is imported inside functions: the engine may import this module for its
  pydantic models without pulling torch in.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field

from phases.add_moe_model.work.error_origin import describe_error
from phases.add_moe_model.work.firmness import measure_firmness
from phases.add_moe_model.work.kl import Status, cast_float_inputs_to_fp32, hf_moe_forward, measure_output_gap

ROUNDTRIP_TOL = 1e-6
INPUT_SHAPE = (2, 16)


class CompareRequest(BaseModel):
    """One synthetic model to compare; ``dtypes`` is used by ``compare_dtypes`` only."""

    model_type: str
    config_kwargs: dict[str, Any]
    dtype: Literal["bfloat16", "float32"] = "bfloat16"
    dtypes: list[Literal["bfloat16", "float32"]] = Field(default_factory=list)
    device: Literal["cpu", "cuda", "auto"] = "auto"
    seed: int = 42


class RoundTrip(BaseModel):
    """Whole-model HF -> Titan -> HF state-dict round trip."""

    status: Literal["PASS", "FAIL", "ERROR", "SKIP"]
    max_diff: float | None = None
    missing: list[str] = Field(default_factory=list)
    extra: list[str] = Field(default_factory=list)
    shape_mismatch: list[str] = Field(default_factory=list)
    error: str | None = None


class LoadReport(BaseModel):
    """Keys ``load_state_dict(strict=False)`` left out or did not recognise."""

    missing: list[str] = Field(default_factory=list)
    unexpected: list[str] = Field(default_factory=list)
    ours: list[str] = Field(default_factory=list)
    """Unexpected keys the target's own build of the MoE has (as the probe's strict load builds it): our
    worker's build left them out, so the drop is ours, not the adapter's."""


class CompareResult(BaseModel):
    """Metrics of one dtype run; ``status`` follows the KL tiers above."""

    model_type: str
    dtype: str
    device: str
    device_note: str = ""
    status: Status
    kl: float | None = None
    cos_sim: float | None = None
    max_diff: float | None = None
    mean_diff: float | None = None
    firmness: dict[str, Any] | None = None
    """kl_fp64, spread under a one-ulp input change, and edge ("PASS|WARN") when the spread crosses a tier."""
    roundtrip: RoundTrip
    load: LoadReport = Field(default_factory=LoadReport)
    error: str | None = None
    error_type: str | None = None
    error_origin: str | None = None
    """Whose frame raised (work/error_origin.py): transformers, target, orchestrator, torch, other."""
    error_frame: str | None = None
    hf_experts_impl: str = ""
    moe_kind: str = ""
    moe_layout: str = ""
    """Token layout the target's MoE.forward takes and the code that says so (``work/layout.py``)."""
    moe_params: dict[str, Any] = Field(default_factory=dict)
    matmuls_below_run_dtype: dict[str, list[dict[str, Any]]] = Field(default_factory=dict)
    """{"hf": [...], "titan": [...]}: each side's matmuls that ran with fewer bits than ``dtype`` (module, op,
    dtypes, calls; ``work/op_dtypes.py``); both empty: the comparison ran in ``dtype`` on both sides."""
    versions: dict[str, str] = Field(default_factory=dict)
    seed: int
    seconds: dict[str, float] = Field(default_factory=dict)


class CompareAnswer(BaseModel):
    """Answer of ``compare_dtypes``: one result per dtype, in the request's order."""

    results: list[CompareResult]


def classify_roundtrip(raw: dict[str, Any]) -> RoundTrip:
    bad = raw["missing"] or raw["extra"] or raw["shape_mismatch"] or raw["max_diff"] > ROUNDTRIP_TOL
    return RoundTrip(status="FAIL" if bad else "PASS", **raw)


def compare(request: dict[str, Any]) -> dict[str, Any]:
    """Compare one dtype. Request/response: ``CompareRequest`` / ``CompareResult``."""
    req = CompareRequest.model_validate(request)
    return _run(req, [req.dtype])[0].model_dump()


def compare_dtypes(request: dict[str, Any]) -> dict[str, Any]:
    """Compare several dtypes in one process: ``{"results": [CompareResult, ...]}``."""
    req = CompareRequest.model_validate(request)
    dtypes = req.dtypes or [req.dtype]
    return {"results": [r.model_dump() for r in _run(req, dtypes)]}


def _run(req: CompareRequest, dtypes: list[str]) -> list[CompareResult]:
    """Build the HF model once, then compare each dtype; any exception is an ERROR row."""
    from orchestrator.progress import report

    base = dict(model_type=req.model_type, device=req.device, seed=req.seed)
    try:
        bench = prepare_bench(req, first_dtype=dtypes[0])
    except Exception as exc:  # noqa: BLE001 - every failure must become an ERROR row
        # NOTE: the round trip needs the models this raised on: not run, which blames no adapter.
        rt = RoundTrip(status="SKIP", error="not run: the comparison's models could not be built (the row's error)")
        return [_error_result(base, dtype, exc, roundtrip=rt) for dtype in dtypes]
    results = []
    for step, dtype in enumerate(dtypes, start=1):
        report(f"{req.model_type}: comparing in {dtype} on {bench.device}", step=step, total=len(dtypes))
        try:
            results.append(_compare_one(bench, req, dtype=dtype))
        except Exception as exc:  # noqa: BLE001
            results.append(_error_result(bench.base_fields(), dtype, exc, roundtrip=bench.roundtrip))
    return results


def _error_result(base: dict[str, Any], dtype: str, exc: BaseException, *, roundtrip: RoundTrip) -> CompareResult:
    fields = {**base, "dtype": dtype, "status": "ERROR", "roundtrip": roundtrip}
    from phases.add_moe_model.work.error_origin import error_origin

    origin, frame = error_origin(exc)
    fields.update(error=describe_error(exc), error_type=type(exc).__name__, error_origin=origin, error_frame=frame)
    return CompareResult(**fields)


@dataclass(frozen=True, kw_only=True)
class Bench:
    """One HF model built for a request, shared by every dtype run."""

    model_type: str
    config: Any
    model: Any
    site: Any
    device: str
    device_note: str
    hf_impl: str
    roundtrip: RoundTrip
    versions: dict[str, str]
    seed: int
    seconds: dict[str, float]

    def base_fields(self) -> dict[str, Any]:
        return dict(model_type=self.model_type, device=self.device, seed=self.seed,
                    device_note=self.device_note, hf_experts_impl=self.hf_impl,
                    versions=self.versions)


def resolve_device(wanted: str) -> tuple[str, str]:
    """Return (device, note); "auto" takes CUDA when this process can see one."""
    import torch

    has_cuda = torch.cuda.is_available()
    if wanted == "cuda" and not has_cuda:
        raise RuntimeError("device='cuda' requested but torch.cuda.is_available() is False")
    if wanted == "cpu" or not has_cuda:
        why = "requested" if wanted == "cpu" else "no CUDA device"
        return "cpu", (f"ran on CPU ({why}); the skill's Phase 3 runs on 1 GPU. torch disables a CPU "
                       "autocast(dtype=float32), the one Titan's router puts around its gate (CPU autocast "
                       "takes bf16/fp16 only; torch's warning in the worker log says so); the gap analysis' "
                       "stage trace measures each side's router-logits dtype")
    return "cuda", torch.cuda.get_device_name(0)


def collect_versions() -> dict[str, str]:
    import importlib.metadata

    import torch
    import torchtitan
    import transformers

    try:
        dist = importlib.metadata.distribution("torchtitan")
        installed = str(dist.locate_file("torchtitan")) == str(torchtitan.__path__[0])
        titan_version = dist.version if installed else f"checkout (not the installed {dist.version})"
    except importlib.metadata.PackageNotFoundError:
        titan_version = "unknown"
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "torchtitan": titan_version, "torchtitan_path": str(torchtitan.__path__[0])}


def prepare_bench(req: CompareRequest, *, first_dtype: str) -> Bench:
    t0 = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM

    from phases.add_moe_model.work import moe_blocks

    backend_t = time.perf_counter()
    __import__(f"{moe_blocks.EXP}.state_dict_adapter")
    seconds = {"import": elapsed(t0), "import_backend": elapsed(backend_t)}
    device, note = resolve_device(req.device)
    t1 = time.perf_counter()
    config = moe_blocks.build_config_from_entry(req.model_type, req.config_kwargs)
    model_cls = AutoModelForCausalLM._model_mapping[type(config)]
    hf_impl = moe_blocks.set_experts_impl(config, model_cls=model_cls)
    torch.manual_seed(req.seed)
    with torch.device(device):  # initialised where it runs: real-size experts on a CPU took minutes
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, first_dtype)).eval()
    seconds["build_hf"] = elapsed(t1)
    roundtrip = measure_roundtrip_safely(model)
    site = moe_blocks.find_moe_site(model)
    return Bench(model_type=req.model_type, config=config, model=model, site=site,
                  device=device, device_note=note, hf_impl=hf_impl, roundtrip=roundtrip,
                  versions=collect_versions(), seed=req.seed, seconds=seconds)


def measure_roundtrip_safely(model: Any) -> RoundTrip:
    """The round trip is its own verdict: an adapter exception there must not hide the forward check."""
    from phases.add_moe_model.work import moe_blocks

    try:
        return classify_roundtrip(moe_blocks.measure_roundtrip(model))
    except Exception as exc:  # noqa: BLE001
        return RoundTrip(status="ERROR", error=describe_error(exc))


def _compare_one(bench: Bench, req: CompareRequest, *, dtype: str) -> CompareResult:
    import torch

    from phases.add_moe_model.work import moe_blocks
    from phases.add_moe_model.work.layout import detect_moe_layout

    fields = {**bench.base_fields(), "dtype": dtype, "roundtrip": bench.roundtrip}
    if bench.site is None:
        return CompareResult(**fields, status="SKIP", error="no MoE layer in the synthetic model")
    seconds = dict(bench.seconds) if dtype == (req.dtypes or [req.dtype])[0] else {}
    dt, dev = getattr(torch, dtype), torch.device(bench.device)
    t0 = time.perf_counter()
    hf_out, x = run_hf_side(bench.site, hidden=bench.config.hidden_size, dtype=dt, device=dev, seed=bench.seed)
    seconds["hf_forward"] = elapsed(t0)
    t1 = time.perf_counter()
    params = moe_blocks.probe_moe_params(bench.site, bench.config)
    if bench.site.kind == "layer":
        params = {**params, "shared_expert_info": None}  # routed experts only, as on the HF side
    titan = moe_blocks.build_titan_moe(params, bench.config, device=dev, dtype=dt)
    load = moe_blocks.load_through_adapter(titan, bench.site)
    if load["unexpected"]:
        load["ours"] = sorted(set(load["unexpected"]) & moe_blocks.keys_of_target_build(params, bench.config))
    layout = detect_moe_layout(titan, hidden=bench.config.hidden_size)
    with torch.no_grad():
        tt_out = titan(layout.tokens(x))
    seconds["titan_build_and_forward"] = elapsed(t1)
    metrics = measure_output_gap(hf_out.reshape(tt_out.shape), tt_out)
    if metrics["kl"] is not None:
        t2 = time.perf_counter()
        metrics["firmness"] = measure_firmness_safely(bench.site, titan, x, hf_out.reshape(tt_out.shape), tt_out,
                                                      kl=metrics["kl"], layout=layout)
        seconds["firmness"] = elapsed(t2)
    below = measure_matmuls_below(bench.site, titan, x, layout=layout, dtype=dt)
    return CompareResult(**fields, **metrics, load=LoadReport(**load), moe_kind=bench.site.kind,
                         moe_layout=f"{layout.name}: {layout.evidence}", matmuls_below_run_dtype=below,
                         moe_params=_jsonable(params), seconds=seconds)


def measure_matmuls_below(site: Any, titan: Any, x: Any, *, layout: Any, dtype: Any) -> dict[str, list[dict]]:
    """Each side's forward once more under the dtype recorder: which matmuls ran below the run's dtype."""
    from phases.add_moe_model.work.firmness import hf_forward_fp32_router
    from phases.add_moe_model.work.op_dtypes import matmuls_below

    return {"hf": matmuls_below(site.block, lambda: hf_forward_fp32_router(site, x), dtype=dtype),
            "titan": matmuls_below(titan, lambda: titan(layout.tokens(x)), dtype=dtype)}


def measure_firmness_safely(site: Any, titan: Any, x: Any, hf_out: Any, tt_out: Any, *, kl: float,
                            layout: Any) -> dict[str, Any]:
    """The tier's firmness (work/firmness.py); a failure there is recorded (the phase makes it an error of ours)."""
    try:
        return measure_firmness(site, titan, x, hf_out, tt_out, kl=kl, layout=layout)
    except Exception as exc:  # noqa: BLE001
        return {"error": describe_error(exc)}


def run_hf_side(site: Any, *, hidden: int, dtype: Any, device: Any, seed: int) -> tuple[Any, Any]:
    """Run the unmodified HF MoE part on x = randn(2, 16, H); return (output, x).

    The only change to HF: router/gate in fp32 plus a pre-hook casting its float
    inputs to fp32 (mirrors Titan's fp32 autocast on the gate); removed afterwards.
    """
    import torch

    for module in site_modules(site):
        module.to(device=device, dtype=dtype)
    router = site.router.float()
    handle = router.register_forward_pre_hook(cast_float_inputs_to_fp32)
    try:
        torch.manual_seed(seed)
        x = torch.randn(*INPUT_SHAPE, hidden, dtype=dtype, device=device)
        with torch.no_grad():
            return hf_moe_forward(site, x), x
    finally:
        handle.remove()


def site_modules(site: Any) -> list[Any]:
    if site.kind == "block":
        return [site.block]
    return [site.router, site.experts]


def _jsonable(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, (int, float, str, bool, dict, type(None))) else repr(v) for k, v in params.items()}


def elapsed(since: float) -> float:
    return round(time.perf_counter() - since, 3)
