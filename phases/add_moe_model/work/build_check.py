"""Phase 4 pre-check worker: does every module of the backend model get a sharding config?

Without GPUs the skill's torchrun jobs cannot run, but their first failure mode can be
checked on CPU: for world sizes 2, 4 and 8 (FSDP+EP, FSDP+TP+EP, FSDP+TP+EP) a fake
process group stands in for the ranks, the backend model for the synthetic config is
built on meta through the target's own ``HFTransformerModel`` (config saved to a temp
dir and read back through ``update_from_config``: no hub), and the target's
parallelize steps 1-3 run as in ``parallelize_hf_transformers``:
``build_and_swap_native_moe`` -> ``convert_hf_to_module`` -> ``set_hf_sharding_configs``,
which ends in ``_assert_all_states_sharded``; any module it names is a FAIL.
Step 4, ``model.parallelize(parallel_dims)`` on the fake mesh, is attempted and its
outcome reported on its own line: it distributes states but runs no collective, so a
PASS there says the placements are consistent, not that training works.
"""

from __future__ import annotations

import ast
import tempfile
from types import SimpleNamespace
from typing import Any, Literal

from pydantic import BaseModel, Field

# (world_size, tp, ep): EP borrows from the dp_shard * tp product, it does not add ranks.
LAYOUTS = ((2, 1, 2), (4, 2, 2), (8, 2, 4))


class BuildCheckRequest(BaseModel):
    model_type: str
    config_kwargs: dict[str, Any]
    world_sizes: list[int] = Field(default_factory=lambda: [ws for ws, _, _ in LAYOUTS])
    parallelize: bool = True


class WorldResult(BaseModel):
    """One world size; ``status`` is FAIL when any module lacks a sharding config."""

    world_size: int
    tp: int
    ep: int
    status: Literal["PASS", "FAIL"]
    error: str | None = None
    error_type: str | None = None
    error_origin: str | None = None
    """Whose code raised the build error: "transformers", "target", "orchestrator", "torch" or "other"."""
    error_frame: str | None = None
    """The innermost frame outside torch, "path:line function" (work/error_origin.py)."""
    unsharded_modules: list[str] = Field(default_factory=list)
    failed_layers: list[int] = Field(default_factory=list)
    """Decoder layers of the synthetic model on which the target's per-layer sharding setup raised or left a
    module without a config, found by running it again layer by layer after a FAIL (the kind of each is the
    synthetic phase's ``layers``)."""
    parallelize: Literal["PASS", "FAIL", "not_run"] = "not_run"
    parallelize_error: str | None = None
    dtensor_params: int = 0
    """Parameters that ``model.parallelize`` turned into DTensors (evidence it sharded)."""
    plain_params: int = 0
    placements: dict[str, str] = Field(default_factory=dict)
    """A few parameter FQNs with their DTensor placements, e.g. the routed experts."""
    checked: str = ""


class BuildCheckResult(BaseModel):
    model_type: str
    results: list[WorldResult]
    device: str = "meta (fake process group, no collectives run)"
    versions: dict[str, str] = Field(default_factory=dict)


def build_check(request: dict[str, Any]) -> dict[str, Any]:
    """Request: ``BuildCheckRequest``; response: ``BuildCheckResult``."""
    from orchestrator.progress import report
    from phases.add_moe_model.work.numerics import collect_versions

    req = BuildCheckRequest.model_validate(request)
    layouts = {ws: (tp, ep) for ws, tp, ep in LAYOUTS}
    results = []
    with tempfile.TemporaryDirectory(prefix="hf_cfg_") as cfg_dir:
        save_synthetic_config(req.model_type, req.config_kwargs, cfg_dir)
        for step, ws in enumerate(req.world_sizes, start=1):
            tp, ep = layouts[ws]
            report(f"{req.model_type}: sharding check world_size={ws} tp={tp} ep={ep}", step=step,
                   total=len(req.world_sizes))
            results.append(check_world(cfg_dir, world_size=ws, tp=tp, ep=ep, parallelize=req.parallelize))
    return BuildCheckResult(model_type=req.model_type, results=results, versions=collect_versions()).model_dump()


def save_synthetic_config(model_type: str, config_kwargs: dict[str, Any], path: str) -> None:
    """Write the synthetic config as a local HF checkpoint dir (config.json only)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from phases.add_moe_model.work.moe_blocks import build_config_from_entry

    config = build_config_from_entry(model_type, config_kwargs)
    # NOTE: real checkpoints name their class; the backend builds from architectures[0].
    config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]]
    config.save_pretrained(path)


def check_world(cfg_dir: str, *, world_size: int, tp: int, ep: int, parallelize: bool) -> WorldResult:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    base = dict(world_size=world_size, tp=tp, ep=ep)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    model = None
    try:
        dims = build_parallel_dims(world_size=world_size, tp=tp, ep=ep)
        model = build_backend_model(cfg_dir)
        unsharded, error = apply_target_sharding(model, dims)
        checked = ("build_and_swap_native_moe + convert_hf_to_module + set_hf_sharding_configs "
                   "(incl. _assert_all_states_sharded) on meta; model.parallelize on the fake mesh "
                   "when asked (states placed, no collective run)")
        if unsharded or error:
            return WorldResult(**base, status="FAIL", error=error, unsharded_modules=unsharded, checked=checked,
                               failed_layers=failing_layers(model, enable_sp=dims.tp_enabled))
        if not parallelize:
            return WorldResult(**base, status="PASS", checked=checked)
        outcome, p_error = try_parallelize(model, dims)
        return WorldResult(**base, status="PASS", parallelize=outcome, parallelize_error=p_error, checked=checked,
                           **summarize_placements(model))
    except Exception as exc:  # noqa: BLE001 - a build error is this world size's FAIL
        from phases.add_moe_model.work.error_origin import describe_error, error_origin

        origin, frame = error_origin(exc)
        failed = failing_layers(model, enable_sp=tp > 1) if model is not None else []
        return WorldResult(**base, status="FAIL", error=describe_error(exc), error_type=type(exc).__name__,
                           error_origin=origin, error_frame=frame, failed_layers=failed)
    finally:
        dist.destroy_process_group()


def build_parallel_dims(*, world_size: int, tp: int, ep: int) -> Any:
    from torchtitan.distributed.parallel_dims import ParallelDims

    dims = ParallelDims(dp_replicate=1, dp_shard=-1, cp=1, tp=tp, pp=1, ep=ep, world_size=world_size)
    dims.build_mesh()
    return dims


def build_backend_model(cfg_dir: str) -> Any:
    """The target's HFTransformerModel for the saved config, built on meta."""
    import torch

    from torchtitan.experiments.transformers_modeling_backend import HFTransformerModel, TitanMoeModelConfig

    cfg = HFTransformerModel.Config(model_config=TitanMoeModelConfig())
    # NOTE: torchtitan 0.3.0 reads training.seq_len, later trees training.max_context_length.
    job = SimpleNamespace(hf_model=cfg_dir, training=SimpleNamespace(seq_len=64, max_context_length=64),
                          parallelism=None, debug=SimpleNamespace(deterministic=False), loss=SimpleNamespace())
    try:
        cfg.update_from_config(config=job)
    except AttributeError as exc:
        if not isinstance(getattr(exc, "obj", None), SimpleNamespace):
            raise
        from phases.add_moe_model.work.layout import UnknownTargetApi, where

        raise UnknownTargetApi(f"unknown target API: {where(type(cfg).update_from_config)} update_from_config "
                               f"reads job-config field {exc.name!r}, which the build check's job config does "
                               "not carry (phases/add_moe_model/work/build_check.py)") from exc
    with torch.device("meta"):
        return cfg.build()


def apply_target_sharding(model: Any, dims: Any) -> tuple[list[str], str | None]:
    """Steps 1-3 of the target's parallelize; returns (unsharded modules, other error)."""
    from torchtitan.experiments.transformers_modeling_backend import hf_sharding, module_conversion
    from torchtitan.experiments.transformers_modeling_backend.moe_replacement import build_and_swap_native_moe

    if any(getattr(block, "moe_enabled", False) for block in model.layers):
        build_and_swap_native_moe(model, dims)
    module_conversion.convert_hf_to_module(model)
    try:
        hf_sharding.set_hf_sharding_configs(model, enable_sp=dims.tp_enabled)
    except ValueError as exc:
        names = parse_unsharded(str(exc))
        return names, (None if names else f"ValueError: {exc}")
    return [], None


def failing_layers(model: Any, *, enable_sp: bool) -> list[int]:
    """The layers on which the target's ``_set_layer_sharding_configs`` or its backstop fails, one by one."""
    from torchtitan.experiments.transformers_modeling_backend import hf_sharding

    failed = []
    for position, block in enumerate(model.layers.values() if hasattr(model.layers, "values") else model.layers):
        moe = hf_sharding._moe_subtree(block) if hasattr(hf_sharding, "_moe_subtree") else None
        try:
            hf_sharding._set_layer_sharding_configs(block, enable_sp=enable_sp)
            hf_sharding._assert_all_states_sharded(block, path=f"layers.{position}", skip=(moe,) if moe else ())
        except Exception:  # noqa: BLE001 - any raise marks the layer; the world's own error is kept as it was
            failed.append(position)
    return failed


def parse_unsharded(message: str) -> list[str]:
    """Module paths from ``_assert_all_states_sharded``'s message (a Python list literal)."""
    marker = "Unsharded modules with no _sharding_config:"
    if marker not in message:
        return []
    tail = message.split(marker, 1)[1]
    try:
        return list(ast.literal_eval(tail[: tail.index("]") + 1].strip()))
    except (ValueError, SyntaxError):
        return [tail.strip()]


def try_parallelize(model: Any, dims: Any) -> tuple[str, str | None]:
    try:
        model.parallelize(dims)
    except Exception as exc:  # noqa: BLE001 - reported, does not hide the sharding verdict
        return "FAIL", f"{type(exc).__name__}: {exc}"[:2000]
    return "PASS", None


def summarize_placements(model: Any) -> dict[str, Any]:
    """Count DTensor vs plain parameters; keep placements of experts, attention and embedding."""
    from torch.distributed.tensor import DTensor

    dtensors, plain, shown = 0, 0, {}
    for name, param in model.named_parameters():
        if not isinstance(param, DTensor):
            plain += 1
            continue
        dtensors += 1
        if len(shown) < 8 and any(k in name for k in ("inner_experts", "q_proj", "embed_tokens", "router.gate")):
            shown[name] = f"{tuple(param.device_mesh.mesh_dim_names or ())}: {param.placements}"
    for name, param in model.named_parameters():
        if len(shown) < 8 and "inner_experts" in name and not isinstance(param, DTensor):
            shown[name] = f"plain tensor, local shape {tuple(param.shape)}"
    return {"dtensor_params": dtensors, "plain_params": plain, "placements": shown}
