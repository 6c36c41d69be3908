"""Worker of the correctness phase's TP/EP build check: the embedded layer at world 8 on a fake process group.

In one process (torch's "fake" backend: ``FakeStore``, one rank at a time), with the plan of
``tp_ep_plan`` on a mesh of all ``world_size`` ranks (EP borrows TP's ranks, as at DSv3's TP8/EP8):

1. shapes at the real DSv3 dims: the two blocks built on meta and parallelized, every parameter's
   local shape against its global one (``shapes_real``);
2. the stepped layer: DSv3's head, expert and group counts (128 heads, 256 experts in 8 groups,
   top-8) with narrow widths, so a CPU steps it; its shapes again (``shapes_build``);
3. rank 0: fwd+bwd at two token counts with the candidate's regions compiled (the second step is
   where a region's sizes go dynamic, as a rank's row counts change from step to step);
4. the last rank with every router biased away from its experts, so they get no token: fwd+bwd at
   the first token count. The regions compiled for rank 0 carry over (one process), so what this
   rank adds is the recompile an EP rank pays the first time it gets no token.

Graphs per region are Dynamo's cache entries (kit graphs); ``graph_budget`` holds every rank to the
headroom target. ``compile_backend`` other than inductor (tests: ``aot_eager``) binds the regions
through that backend: the same Dynamo graphs and guards, no Inductor code generation. Any error is
recorded with its message as the item's FAIL; nothing here is a numeric result.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib
from collections.abc import Iterator
from typing import Any

from pydantic import Field

from phases.kit.harness import HarnessRequest
from phases.local_compile_perf.records import ParallelBuildCheck, ParamShard, RankRun

BUILD_WIDTHS = {"dim": 64, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
                "v_head_dim": 8, "inter_dim": 64, "moe_inter_dim": 16}
"""Every width of the stepped layer; each TP-sharded one divides by 8, each stays a multiple of 4."""
NOTE = ("fake process group: collectives move no data and a rank cannot see what its peers send, so every peer "
        "is modelled as routing like the rank stepped (it receives, from each EP peer, that rank's rows for its "
        "experts); values are arbitrary: a build check (shapes, graphs, no crash), not a correctness comparison")


class ParallelCheckRequest(HarnessRequest):
    regions: tuple[str, ...]
    world_size: int = 8
    tp: int = 8
    ep: int = 8
    tokens: tuple[int, int] = (16, 24)
    """Tokens of rank 0's two steps; the zero-token rank steps at the first."""
    compile_backend: str = "inductor"
    build_widths: dict[str, int] = Field(default_factory=lambda: dict(BUILD_WIDTHS))


def tp_ep_worker(request: dict) -> dict:
    """ParallelCheckRequest -> ParallelBuildCheck dump."""
    import torch

    from phases.kit.harness import load_harness

    req = ParallelCheckRequest.model_validate(request)
    base = dict(world_size=req.world_size, tp=req.tp, ep=req.ep, regions=req.regions,
                compile_backend=req.compile_backend, torch=torch.__version__, note=NOTE)
    harness = load_harness(req.harness)
    problem = layout_problem(req) or embedded_problem(harness)
    if problem:
        return ParallelBuildCheck(status="UNRUN", reason=problem, **base).model_dump(mode="json")
    try:
        return run_check(harness, req, base).model_dump(mode="json")
    finally:
        harness.bind_regions([])


def layout_problem(req: ParallelCheckRequest) -> str:
    """Why this TP/EP layout is not one the plan builds ("" when it is)."""
    if {req.tp, req.ep} - {1, req.world_size}:
        return (f"tp {req.tp} / ep {req.ep} at world {req.world_size}: the plan shards over all ranks or none "
                "(EP borrows TP's ranks)")
    return ""


def embedded_problem(harness: Any) -> str:
    """Why ``harness`` is not the embedded layer's (its config dataclass and ``dsv3_config``), or ""."""
    package = type(harness).__module__.rpartition(".")[0]
    config = getattr(harness, "config", None)
    if not dataclasses.is_dataclass(config) or not hasattr(config, "n_heads"):
        return f"{type(harness).__name__} is not the embedded layer's harness: the build check is written for it"
    try:
        importlib.import_module(f"{package}.config").dsv3_config
    except (ImportError, AttributeError) as exc:
        return f"{package}.config.dsv3_config: {exc}"
    return ""


def with_config(harness: Any, **fields: Any) -> Any:
    """A copy of the embedded harness whose layers are built from DSv3's real config with ``fields`` replaced."""
    package = type(harness).__module__.rpartition(".")[0]
    real = importlib.import_module(f"{package}.config").dsv3_config("real")
    built = copy.copy(harness)
    built.config = dataclasses.replace(real, **fields)
    return built


def run_check(harness: Any, req: ParallelCheckRequest, base: dict[str, Any]) -> ParallelBuildCheck:
    import torch._dynamo
    from torch._dynamo.utils import counters

    from orchestrator.progress import report
    from phases.kit.graphs import HEADROOM_SHARE, region_functions

    items, failures = {}, {}
    report(f"TP/EP build check: shapes at DSv3's real dims, world {req.world_size} (meta)")
    shapes_real = checked_shapes("shapes_real", lambda: shapes_at(with_config(harness, ep_degree=1), req, "meta"),
                                 items, failures)
    stepped = with_config(harness, ep_degree=1, **req.build_widths)
    report("TP/EP build check: shapes of the stepped layer")
    shapes_build = checked_shapes("shapes_build", lambda: shapes_at(stepped, req, "cpu"), items, failures)
    with compile_backend(req.compile_backend):
        harness.bind_regions(list(req.regions))
    functions = region_functions(harness, req.regions)
    torch._dynamo.reset()
    counters.clear()
    first = run_rank(stepped, req, rank=0, tokens=req.tokens, zero_tokens=False, functions=functions)
    seen = guard_failures_of(functions)
    last = run_rank(stepped, req, rank=req.world_size - 1, tokens=req.tokens[:1], zero_tokens=True,
                    functions=functions)
    limit = int(torch._dynamo.config.recompile_limit)
    target = int(limit * HEADROOM_SHARE)
    for run in (first, last):
        items[f"rank_{run.rank}"] = run.status
        if run.error:
            failures[f"rank_{run.rank}"] = run.error
    growth = {n: last.graphs_after.get(n, 0) - first.graphs_after.get(n, 0) for n in first.graphs_after}
    judge_graphs(items, failures, growth=growth, last=last, first=first, target=target)
    return ParallelBuildCheck(
        status="FAIL" if "FAIL" in items.values() else "PASS", items=items, failures=failures,
        reason="; ".join(f"{k}: {v}" for k, v in failures.items()), build_dims=dict(req.build_widths),
        shapes_real=shapes_real, shapes_build=shapes_build, ranks=(first, last), graphs=first.graphs_after,
        zero_token_growth=growth, recompile_reasons=recompile_reasons(functions, seen),
        graph_breaks=int(sum(counters["graph_break"].values())), recompile_limit=limit, target=target, **base)


def judge_graphs(items: dict[str, str], failures: dict[str, str], *, growth: dict[str, int], last: RankRun,
                 first: RankRun, target: int) -> None:
    """zero_token_graphs: the empty rank compiled nothing new; graph_budget: every rank within the target."""
    if last.status != "PASS" or first.status != "PASS":
        items["zero_token_graphs"] = items["graph_budget"] = "UNRUN"
        return
    grew = {n: g for n, g in growth.items() if g}
    items["zero_token_graphs"] = "FAIL" if grew else "PASS"
    if grew:
        failures["zero_token_graphs"] = f"the zero-token rank recompiled: {grew} more graphs"
    over = {n: g for n, g in last.graphs_after.items() if g > target}
    items["graph_budget"] = "FAIL" if over else "PASS"
    if over:
        failures["graph_budget"] = f"graphs over the headroom target {target}: {over}"


def checked_shapes(item: str, build: Any, items: dict[str, str], failures: dict[str, str]) -> tuple[ParamShard, ...]:
    """Run ``build`` (-> ParamShards) as ``item``: FAIL on a parameter not split by its degree, or on an error."""
    try:
        shards = build()
    except Exception as exc:  # noqa: BLE001 - the build error is this item's FAIL, recorded with its message
        items[item], failures[item] = "FAIL", error_text(exc)
        return ()
    bad = [s.name for s in shards if not s.ok]
    items[item] = "FAIL" if bad else "PASS"
    if bad:
        failures[item] = f"local shapes not the global split by the degree: {bad[:8]}"
    return shards


def shapes_at(harness: Any, req: ParallelCheckRequest, device: str) -> tuple[ParamShard, ...]:
    """Rank 0's parameters after the plan, for layers built on ``device``."""
    import torch

    from phases.local_compile_perf.work.tp_ep_plan import param_shards, parallelize_layers

    with fake_rank(0, req.world_size) as mesh:
        workload = harness.build(tokens=req.tokens[0], device=device, dtype=torch.bfloat16, seed=req.seed)
        parallelize_layers(workload.layers, mesh, rank=0, tp=req.tp, ep=req.ep)
        return tuple(ParamShard(**row) for row in param_shards(workload.layers))


def run_rank(harness: Any, req: ParallelCheckRequest, *, rank: int, tokens: tuple[int, ...], zero_tokens: bool,
             functions: dict[str, Any]) -> RankRun:
    """fwd+bwd at each of ``tokens`` as ``rank``; the error, if one is raised, is the run's FAIL."""
    import torch

    from orchestrator.progress import Eta, report
    from phases.local_compile_perf.work.tp_ep_plan import parallelize_layers, starve_rank

    sent, received, empty, stand_ins, error = [], [], 0, [], ""
    who, eta = f"rank {rank}" + (" (zero tokens)" if zero_tokens else ""), Eta(len(tokens))
    try:
        with fake_rank(rank, req.world_size) as mesh:
            for step, n in enumerate(tokens):
                eta.report(f"TP/EP build check: {who} fwd+bwd at {n} tokens")
                workload = harness.build(tokens=n, device="cpu", dtype=torch.bfloat16, seed=req.seed + step)
                exchanges = parallelize_layers(workload.layers, mesh, rank=rank, tp=req.tp, ep=req.ep)
                if zero_tokens and not starve_rank(workload.layers, rank=rank, ep=req.ep):
                    raise RuntimeError("no router has a correction_bias buffer to steer tokens away from this rank")
                workload.step()
                sent.append(sum(e.rows_sent for e in exchanges))
                received.append(sum(e.rows_received for e in exchanges))
                empty += sum(e.empty_experts for e in exchanges)
                stand_ins += [s for e in exchanges for s in e.stand_ins]
                eta.step_done()
    except Exception as exc:  # noqa: BLE001 - a crash on this rank is its FAIL, recorded with its message
        error = error_text(exc)
    if zero_tokens and not error and any(received):
        error = f"routing was biased away from rank {rank}, yet its experts received {received} rows"
    return RankRun(rank=rank, tokens=tokens, zero_tokens=zero_tokens, status="FAIL" if error else "PASS",
                   error=error, rows_sent=tuple(sent), rows_received=tuple(received), empty_expert_calls=empty,
                   graphs_after=cache_entries(functions), stand_ins=tuple(dict.fromkeys(stand_ins)))


@contextlib.contextmanager
def fake_rank(rank: int, world_size: int) -> Iterator[Any]:
    """A fake process group as ``rank`` of ``world_size`` and a 1-D CPU mesh over it."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp_ep",))
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def compile_backend(backend: str) -> Iterator[None]:
    """Within: ``torch.compile`` defaults to ``backend`` (the regions are bound through it)."""
    import functools

    import torch

    if backend == "inductor":
        yield
        return
    original = torch.compile
    torch.compile = functools.partial(original, backend=backend)
    try:
        yield
    finally:
        torch.compile = original


def cache_entries(functions: dict[str, Any]) -> dict[str, int]:
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return {name: len(_debug_get_cache_entry_list(getattr(fn, "__code__", fn))) for name, fn in functions.items()}


def guard_failures_of(functions: dict[str, Any]) -> dict[str, list[Any]]:
    """Dynamo's guard failures so far, per region function (a copy)."""
    from torch._dynamo.utils import guard_failures

    return {name: list(guard_failures.get(getattr(fn, "__code__", fn), [])) for name, fn in functions.items()}


def recompile_reasons(functions: dict[str, Any], seen: dict[str, list[Any]]) -> tuple[str, ...]:
    """The guard failures since ``seen`` (the zero-token rank's), "region: reason", first lines, deduplicated."""
    reasons = []
    for name, failures in guard_failures_of(functions).items():
        for failure in failures[len(seen.get(name, [])):]:
            reasons.append(f"{name}: {str(getattr(failure, 'reason', failure)).splitlines()[0][:300]}")
    return tuple(dict.fromkeys(reasons))


def error_text(exc: BaseException) -> str:
    """``Type: first line``, plus Dynamo's explanation and the user-code line where it gives them."""
    lines = [line.strip() for line in str(exc).strip().splitlines()] or [""]
    parts = [lines[0]]
    start = next((i for i, line in enumerate(lines) if line.startswith("Explanation:")), None)
    if start is not None:
        ends = (i for i in range(start + 1, len(lines)) if not lines[i] or lines[i].startswith("Hint:"))
        end = next(ends, len(lines))
        parts.append(" ".join(lines[start:end]))
    user = [lines[i + 1] for i, line in enumerate(lines[:-1]) if line == "from user code:"][:1]
    parts += user or [raised_at(exc)]
    return f"{type(exc).__name__}: {' | '.join(p for p in parts if p)}"[:900]


def raised_at(exc: BaseException) -> str:
    """The innermost frame outside torch and the standard library (else the innermost): where to look."""
    import sysconfig
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    stdlib = sysconfig.get_paths()["stdlib"]
    own = [f for f in frames if not f.filename.startswith(stdlib) and "/torch/" not in f.filename] or frames
    return f'File "{own[-1].filename}", line {own[-1].lineno}, in {own[-1].name}' if own else ""
