"""Step 0, plan: the sizes, the budget, the stop rule and the target's inventory.

The run's options and its target workspace are resolved before it exists (``start.py``).
Sizes (token counts, per-layer compile points, warm-up/timed/profiled steps) default to the
skill's on a CUDA device and to what a 2-core CPU host finishes on CPU (``default_sizes``);
the device is known only after the probe, so the plan phase fills them in and says why.

A tree without a local_compile API (torchtitan 0.3.0) is a valid target whose plan phase
fails and records what is missing: the trail then says why the effort stopped.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any


from orchestrator.phase_api import Issue, PhaseContext, PhaseResult
from phases.kit.harness import HarnessSpec, TimingKnobs
from phases.local_compile_perf.devlog import log
from phases.local_compile_perf.records import Plan, Sizes
from phases.local_compile_perf.start import resolve_budget_s

STOP_THRESHOLD = 0.01
CUDA_SIZES = Sizes(tokens=(2048, 4096, 16384), per_layer_tokens=(2048, 4096, 16384), timing=TimingKnobs(), runs=3,
                   source="cuda defaults", why="the skill's sizes: 2k/4k/16k tokens, 5 warm-up + 20 timed + 5 profiled "
                                               "steps, per-layer compile at every count")
CPU_SIZES = Sizes(tokens=(256, 512, 1024), per_layer_tokens=(512,),
                  timing=TimingKnobs(warmup=2, iters=5, profile_steps=2), runs=3, source="cpu defaults",
                  why="a CPU host: the skill's 2k/4k/16k x 5/20/5 ran 25 minutes on 2 cores without finishing its "
                      "first eager baseline (attention grows with tokens squared), so 256/512/1024 tokens keep the "
                      "small-to-large x4 spread, 2 warm-up + 5 timed + 2 profiled steps, and per-layer compile at "
                      "512 only (its cold compile is ~45 s per shape on 2 cores): plan .. rank fits in ~10 minutes. "
                      "A host timer ranks ops; it does not gate candidates")


def default_sizes(device: str) -> Sizes:
    return CUDA_SIZES if device.startswith("cuda") else CPU_SIZES


def resolve_sizes(options: dict[str, Any], device: str) -> Sizes:
    """The run's sizes: each option given wins, the rest are the device's defaults."""
    base = default_sizes(device)
    knobs = {k: options[k] for k in ("warmup", "iters", "profile_steps") if options.get(k) is not None}
    given = options.get("tokens") is not None and len(knobs) == 3 and bool(options.get("per_layer_tokens"))
    tokens = tuple(options["tokens"]) if options.get("tokens") is not None else base.tokens
    per_layer = tuple(options.get("per_layer_tokens") or ()) or (
        tokens if options.get("tokens") else base.per_layer_tokens)
    return Sizes(tokens=tokens, per_layer_tokens=per_layer, timing=base.timing.model_copy(update=knobs),
                 runs=options["runs"], source="given" if given else base.source,
                 why=(options.get("sizes_why") or "as given") if given else base.why)


def run(ctx: PhaseContext) -> PhaseResult:
    """Inventory the tree, resolve device, sizes and harness, write plan.md and the devlog's first entry."""
    opts = ctx.options
    inventory = probe_inventory(ctx.target, kind=opts["target_kind"])
    if inventory.get("region_api") == "none":
        return _stop_no_api(ctx, inventory)
    if not opts["harness"]:
        return PhaseResult(outcome="failed", summary="plan: no harness for this tree",
                           issues=(Issue(code="harness_missing", message="a torchtitan tree needs --harness MOD:FN "
                                         "(a factory returning the Harness of phases/kit/harness.py)",
                                         fix_location="orchestrator start ... --harness"),))
    from phases.local_compile_perf.work.probe import TargetProbeRequest
    from phases.local_compile_perf.workers import PROBE

    ctx.plan(1)
    probe = ctx.call(PROBE, TargetProbeRequest(harness=opts["harness"], device=opts["device"]),
                     label="probe").model_dump(mode="json")
    sizes = resolve_sizes(opts, probe["device"])
    plan = Plan(harness=opts["harness"], kind=opts["target_kind"], device=probe["device"],
                device_name=probe["device_name"], torch=probe["torch"], spec=HarnessSpec(**probe["spec"]), sizes=sizes,
                budget=opts["budget"], budget_s=resolve_budget_s(opts["budget"]), stop_threshold=STOP_THRESHOLD,
                correctness_tokens=opts["correctness_tokens"] or min(sizes.tokens),
                delta_tokens=tuple(opts.get("delta_tokens") or ()), rewrite_deltas=opts.get("rewrite_deltas", True),
                per_layer_stack=opts.get("per_layer_stack", True), inventory=inventory,
                started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    ctx.write_artifact("plan.md", ctx.render("plan.md.j2", plan=plan))
    log(ctx, f"plan: budget {opts['budget']}; stop when the remaining gap to ideal or the next candidate's gain "
             f"is under {STOP_THRESHOLD:.0%} of the layer; target {opts['target_spec']} ({plan.kind}), harness "
             f"{plan.harness} ({plan.spec.name}) on {plan.device_name}; tokens {list(sizes.tokens)}, per-layer "
             f"compile at {list(sizes.per_layer_tokens)}, {sizes.timing.warmup}/{sizes.timing.iters}/"
             f"{sizes.timing.profile_steps} warm-up/timed/profiled steps x {sizes.runs} fresh processes "
             f"({sizes.source}: {sizes.why})", kind="decision")
    return PhaseResult(outcome="passed", summary=f"plan: {plan.spec.name} on {plan.device}, tokens "
                                                 f"{list(sizes.tokens)} ({sizes.source}), budget {opts['budget']}",
                       data=plan.model_dump(mode="json"))


def probe_inventory(target: Path, *, kind: str) -> dict[str, Any]:
    """Region API, regions, override kernels and fp32 precision of the target (text only)."""
    from phases.local_compile_perf.tree_adapter import probe_tree, read_embedded_settings

    if kind == "hf":
        return {"region_api": "hf_harness", "message": "HF decoder layers: no regions; eager vs per-layer only",
                "regions": [], "override_kernels": [], "fp32_precision": None}
    if kind == "embedded":
        settings = read_embedded_settings(target)
        return {"region_api": "config_regions", "message": "embedded library: regions enabled by its recipe "
                "(examples/moe_layer/trainer_settings.py UPSTREAM_REGIONS)",
                "regions": _embedded_regions(target), "override_kernels": [],
                "fp32_precision": settings.get("FP32_PRECISION")}
    inv = probe_tree(target)
    return {"region_api": inv.region_api, "message": inv.region_api_message,
            "regions": [f"{h.value} ({h.path}:{h.line})" for h in inv.regions],
            "override_kernels": [h.value for h in inv.override_kernels], "fp32_precision": inv.resolved_fp32_precision}


def _embedded_regions(target: Path) -> list[str]:
    from phases.local_compile_perf.tree_adapter import list_region_declarations

    files = sorted((target / "examples").rglob("*.py"))
    return [f"{h.value} ({h.path}:{h.line})" for h in list_region_declarations(target, files)]


def _stop_no_api(ctx: PhaseContext, inventory: dict[str, Any]) -> PhaseResult:
    log(ctx, f"plan: budget {ctx.options['budget']}; stop when the remaining gap to ideal or the next candidate's gain "
             f"is under {STOP_THRESHOLD:.0%} of the layer; target {ctx.options['target_spec']}", kind="decision")
    log(ctx, f"dead end: {inventory['message']}; nothing can be measured as regions here", kind="dead_end")
    return PhaseResult(outcome="failed", summary=f"plan: {inventory['message']}", data={"inventory": inventory},
                       issues=(Issue(code="no_local_compile_api", message=inventory["message"],
                                     fix_location="torchtitan/distributed/local_compile.py "
                                                  "(use a newer torchtitan main)"),))
