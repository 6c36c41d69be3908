"""Graph budget: how many graphs a region compiles over every shape the model uses.

Dynamo keeps one cache entry per compiled graph of a function; with ``fullgraph=True``
going past ``torch._dynamo.config.recompile_limit`` is a hard error, not a fallback, so
the count must be taken over every training token count, every call site and a
``no_grad`` pass (grad mode is a guard). ``count_graphs`` resets Dynamo, runs the caller's
pass once, then reads the global ``unique_graphs`` counter and, for the functions given,
their cache entries. The headroom target is 75% of the limit (6 of the default 8).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from phases.kit.harness import HarnessRequest
from phases.kit.records import GraphCount

if TYPE_CHECKING:
    import torch

    from phases.kit.harness import Harness

HEADROOM_SHARE = 0.75
"""Graphs allowed per function as a share of recompile_limit (6 of 8)."""


def count_graphs(
    run_all_shapes: Callable[[], None],
    *,
    functions: Mapping[str, Callable[..., object]] | None = None,
) -> GraphCount:
    """Reset Dynamo, run every shape once, and count compiled graphs.

    Args:
        run_all_shapes: runs each token count (fwd+bwd) and a no_grad forward pass.
        functions: region functions by name whose cache entries are counted one by one
            (the undecorated function or its code object).

    Returns:
        GraphCount with the global count, per-function counts, the limit and the target;
        a recompile-limit failure during the pass is recorded in ``limit_hit``.
    """
    import torch._dynamo
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch._dynamo.exc import FailOnRecompileLimitHit
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters["stats"].clear()
    limit_hit = ""
    try:
        run_all_shapes()
    except FailOnRecompileLimitHit as err:
        # NOTE: with fullgraph=True this is the overflow itself; it is the finding, not a crash.
        limit_hit = f"{type(err).__name__}: {str(err).splitlines()[0]}"
    limit = int(torch._dynamo.config.recompile_limit)
    codes = {name: getattr(fn, "__code__", fn) for name, fn in (functions or {}).items()}
    per_function = {name: len(_debug_get_cache_entry_list(code)) for name, code in codes.items()}
    return GraphCount(
        unique_graphs=int(counters["stats"]["unique_graphs"]),
        per_function=per_function,
        recompile_limit=limit,
        target=math.floor(limit * HEADROOM_SHARE),
        limit_hit=limit_hit,
        recompile_reasons=last_recompile_reasons(codes),
    )


def last_recompile_reasons(codes: Mapping[str, object]) -> dict[str, str]:
    """Per function that recompiled: the guard that failed last, in Dynamo's words (first line)."""
    from torch._dynamo.utils import guard_failures

    reasons = {}
    for name, code in codes.items():
        failures = guard_failures.get(code) or []
        if failures:
            reasons[name] = str(failures[-1]).splitlines()[0][:300]
    return reasons


def build_shape_pass(
    harness: "Harness",
    *,
    tokens: Sequence[int],
    device: str,
    dtype: "torch.dtype",
    seed: int,
    num_layers: int = 2,
) -> Callable[[], None]:
    """A ``run_all_shapes`` for a harness: fwd+bwd at each token count, then no_grad.

    The harness's regions must already be bound; workloads are built inside the pass so
    each token count is a fresh set of inputs, as in training. The no_grad forward gets
    detached inputs, as an eval forward does: a leaf that requires grad would cost the first
    layer's regions a graph that no real no_grad pass compiles.
    """

    def run_all_shapes() -> None:
        import torch

        from orchestrator.progress import Eta, report

        eta = Eta(len(tokens))
        for n in tokens:
            eta.report(f"graph count: fwd+bwd at {n} tokens")
            workload = harness.build(tokens=n, device=device, dtype=dtype, seed=seed, num_layers=num_layers)
            workload.step()
            report(f"graph count: no_grad forward at {n} tokens")
            workload.inputs = tuple(t.detach() for t in workload.inputs)
            with torch.no_grad():
                workload.forward()
            eta.step_done()

    return run_all_shapes


def find_region_slots() -> dict[str, Any]:
    """Region name -> its binding record (has ``fn`` and ``compiled``), found on loaded modules.

    A region wrapper carries ``region_name`` and closes over the record the binder fills;
    the record is what the wrapper calls when ``compiled`` is set.
    """
    import inspect
    import sys

    slots: dict[str, Any] = {}
    for module in list(sys.modules.values()):
        for value in list(getattr(module, "__dict__", {}).values()):
            # NOTE: plain functions only; getattr on arbitrary module globals has side effects
            # (ctypes loaders try to dlopen the attribute name).
            if not inspect.isfunction(value):
                continue
            name = getattr(value, "region_name", None)
            if not isinstance(name, str) or name in slots:
                continue
            for cell in getattr(value, "__closure__", None) or ():
                contents = cell.cell_contents
                if hasattr(contents, "fn") and hasattr(contents, "compiled"):
                    slots[name] = contents
    return slots


def region_functions(harness: "Harness", regions: Sequence[str]) -> dict[str, Callable[..., object]]:
    """The functions of ``regions`` whose cache entries count: the harness's own mapping when it
    has one, else the binding slots of the loaded region wrappers."""
    functions = dict(getattr(harness, "region_functions", {}) or {})
    slots = find_region_slots()
    functions.update({n: slots[n].fn for n in regions if n not in functions and n in slots})
    return {n: f for n, f in functions.items() if n in regions}


class GraphBudgetRequest(HarnessRequest):
    """Worker input of ``graph_budget_worker``."""

    regions: tuple[str, ...]
    tokens: tuple[int, ...]
    """Every training token count; each also gets a no_grad pass."""
    dtype: str = "bf16"
    num_layers: int = 2


def graph_budget_worker(request: dict) -> dict:
    """Worker entry ``phases.kit.graphs:graph_budget_worker``: GraphBudgetRequest -> GraphCount.

    Counted per region from the region functions' cache entries (``region_functions``).
    """
    from orchestrator.progress import report
    from phases.kit.harness import load_harness, resolve_dtype

    req = GraphBudgetRequest.model_validate(request)
    report(f"graph count: loading the harness to count {', '.join(req.regions) or 'no region'} over tokens "
           f"{list(req.tokens)}, each with a no_grad pass")
    harness = load_harness(req.harness)
    harness.bind_regions(list(req.regions))
    run = build_shape_pass(harness, tokens=req.tokens, device=req.device, dtype=resolve_dtype(req.dtype),
                           seed=req.seed, num_layers=req.num_layers)
    count = count_graphs(run, functions=region_functions(harness, req.regions))
    harness.bind_regions([])
    return count.model_dump(mode="json")
