"""Step 0, plan: options, the target's workspace, the budget, the stop rule, the inventory.

``prepare`` (before a run exists) resolves ``--target``:

    embedded   the embedded DeepSeek-V3 layer library as its own git workspace (a copy of
               the cached one under <state>/workspaces/, so runs never share stack branches)
    hf:TYPE    an empty git workspace; the HF decoder-layer harness (eager vs per-layer only),
               loaded by the ordinary factory ref ``HF_FACTORY:TYPE``
    PATH       a torchtitan git checkout, read as text by the tree adapter

Sizes (token counts, per-layer compile points, warm-up/timed/profiled steps) default to the
skill's on a CUDA device and to what a 2-core CPU host finishes on CPU (``default_sizes``);
the device is known only after the probe, so the plan phase fills them in and says why.

Bad input exits 2 and writes nothing. A tree without a local_compile API (torchtitan 0.3.0)
is a valid target whose plan phase fails and records what is missing: the trail then says
why the effort stopped.
"""

from __future__ import annotations

import re
import secrets
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from orchestrator.errors import UsageError
from orchestrator.phase_api import Issue, PhaseContext, PhaseResult
from orchestrator.workflow import Prepared
from phases.kit.harness import HarnessSpec, TimingKnobs
from phases.local_compile_perf.devlog import log, renders_devlog
from phases.local_compile_perf.records import Plan, Sizes

EMBEDDED_HARNESS = "examples.moe_layer.harness:build_harness"
HF_FACTORY = "phases.local_compile_perf.work.hf_harness:build_hf_harness"
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
_BUDGET = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h)$")


class LcpOptions(BaseModel):
    """``orchestrator start local-compile-perf`` options (``--name value``)."""

    model_config = ConfigDict(extra="forbid")
    target: str
    """embedded | hf:<model_type> | PATH of a torchtitan checkout."""
    harness: str | None = None
    """module:factory of the harness (default: the embedded one; hf:TYPE for HF)."""
    tokens: tuple[int, ...] | None = None
    """Packed tokens per rank, at least 3 counts (skill: small to large); default by device."""
    per_layer_tokens: tuple[int, ...] = ()
    """Token counts where the per-layer compile tree is measured (default by device; needs --tokens)."""
    budget: str = "2h"
    device: str = "auto"
    runs: int = Field(default=3, ge=3)
    """Fresh processes per cited number (the skill's rule: at least 3)."""
    warmup: int | None = Field(default=None, ge=1)
    iters: int | None = Field(default=None, ge=1)
    profile_steps: int | None = Field(default=None, ge=1)
    """Warm-up, timed and profiled steps per measurement; default by device (see ``default_sizes``)."""
    correctness_tokens: int | None = None
    """Tokens of the parity captures (default: the smallest token count)."""
    python: str | None = None

    @field_validator("tokens", "per_layer_tokens", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(int(v) for v in value.split(",") if v.strip())
        if isinstance(value, int):
            return (value,)
        return value

    @field_validator("tokens")
    @classmethod
    def _three_counts(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is None:
            return None
        if len(set(value)) < 3 or min(value) <= 0:
            raise ValueError(f"needs at least 3 distinct positive token counts (skill step 1), got {list(value)}")
        return tuple(sorted(set(value)))

    @field_validator("budget")
    @classmethod
    def _budget(cls, value: str) -> str:
        if not _BUDGET.match(value):
            raise ValueError(f"budget {value!r} must look like 90m, 2h or 3600s")
        return value


def resolve_budget_s(budget: str) -> float:
    number, unit = _BUDGET.match(budget).groups()  # type: ignore[union-attr]
    return float(number) * {"s": 1, "m": 60, "h": 3600}[unit]


def hf_harness_ref(spec: str) -> str:
    """The factory ref of ``hf:<model_type>[,attn=IMPL][,experts=IMPL]``."""
    return f"{HF_FACTORY}:{spec.removeprefix('hf:')}"


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
                 why="as given" if given else base.why)


def prepare(options: LcpOptions, state_dir: str) -> Prepared:
    """Resolve the target into a git checkout and the harness; UsageError (exit 2) on bad input."""
    if options.per_layer_tokens and options.tokens is None:
        raise UsageError("--per-layer-tokens needs --tokens (the default token counts depend on the device)")
    bad_per_layer = sorted(set(options.per_layer_tokens) - set(options.tokens or ()))
    if bad_per_layer:  # refused before the workspace (or its cache) is made
        raise UsageError(f"--per-layer-tokens {bad_per_layer} are not among --tokens {list(options.tokens)}")
    target, kind = resolve_target(options.target, state_dir=Path(state_dir))
    harness = options.harness or {"embedded": EMBEDDED_HARNESS, "hf": hf_harness_ref(options.target)}.get(kind)
    if harness and harness.startswith("hf:"):
        harness = hf_harness_ref(harness)
    recorded = options.model_dump(mode="json") | {"target_kind": kind, "target_spec": options.target,
                                                  "harness": harness}
    return Prepared(target=str(target), options=recorded)


def resolve_target(spec: str, *, state_dir: Path) -> tuple[Path, str]:
    """(checkout, kind) for ``--target``; kind is embedded, hf or tree."""
    if spec == "embedded":
        from phases.local_compile_perf.workspace import WorkspaceError, materialize_embedded_workspace

        try:
            cached = materialize_embedded_workspace(state_dir)
        except WorkspaceError as exc:
            raise UsageError(str(exc)) from None
        return copy_workspace(cached, name="lcp-embedded"), "embedded"
    if spec.startswith("hf:"):
        if not re.fullmatch(r"hf:[a-z0-9_]+(,(attn|experts)=[a-z0-9_]+)*", spec):
            raise UsageError(f"--target {spec!r}: expected hf:<model_type>[,attn=IMPL][,experts=IMPL], "
                             "e.g. hf:qwen3_moe or hf:qwen3_moe,attn=eager")
        return empty_workspace(state_dir, name=f"lcp-{spec[3:].split(',')[0]}"), "hf"
    path = Path(spec).expanduser().resolve()
    if not (path / ".git").exists():
        raise UsageError(f"--target {path} is not a git checkout; "
                         "pass embedded, hf:<model_type> or a torchtitan checkout")
    from phases.local_compile_perf.tree_adapter import resolve_package_dir

    try:
        resolve_package_dir(path)
    except ValueError as exc:
        raise UsageError(f"--target: {exc}") from None
    return path, "tree"


def _unique(state_dir: Path, name: str) -> Path:
    stamp = f"{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"
    return state_dir / "workspaces" / f"{name}-{stamp}"


def copy_workspace(cached: Path, *, name: str) -> Path:
    """A private copy of the cached workspace (with its git history and candidate branches)."""
    dest = _unique(cached.parent.parent, name)
    shutil.copytree(cached, dest, symlinks=True)
    return dest


def empty_workspace(state_dir: Path, *, name: str) -> Path:
    import git

    from phases.local_compile_perf.workspace import BOT

    dest = _unique(state_dir, name)
    dest.mkdir(parents=True)
    (dest / "README").write_text("workspace of an HF-harness local-compile-perf run (no code to change)\n")
    repo = git.Repo.init(dest, initial_branch="main")
    repo.index.add(["README"])
    repo.index.commit("empty workspace", author=BOT, committer=BOT)
    return dest


@renders_devlog
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
    from phases.local_compile_perf.work.probe import ProbeRequest

    probe = ctx.call_worker("phases.local_compile_perf.work.probe:probe_target_worker",
                            ProbeRequest(harness=opts["harness"], device=opts["device"]).model_dump(), label="probe")
    sizes = resolve_sizes(opts, probe["device"])
    plan = Plan(harness=opts["harness"], kind=opts["target_kind"], device=probe["device"],
                device_name=probe["device_name"], torch=probe["torch"], spec=HarnessSpec(**probe["spec"]), sizes=sizes,
                budget=opts["budget"], budget_s=resolve_budget_s(opts["budget"]), stop_threshold=STOP_THRESHOLD,
                correctness_tokens=opts["correctness_tokens"] or min(sizes.tokens), inventory=inventory,
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
