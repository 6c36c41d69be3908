"""The correctness phase's TP/EP build check on a stack of shipped rewrites, outside a run.

    python bench/tp_ep_stack.py [--rewrites a,b,...] [--backend inductor|aot_eager]

Builds the embedded workspace in a temporary state dir, points ``candidate/stack`` at main plus
the named rewrites (``bench_lcp.replay_rewrites``), checks out that tree and runs the worker the
correctness phase runs (``work/tp_ep_check.py``: world 8, TP8/EP8, a fake process group) with
``router`` plus the rewrites' regions. Prints the check's items, graphs and each rank's error;
exits 0 when nothing blocks (``tp_ep.rule`` against no stack), else 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_lcp import replay_rewrites, shipped_regions  # noqa: E402

STACK = ("norm-rope-cat", "narrow-scores", "gather-combine", "mlp-swiglu", "residual-norm", "latent-proj",
         "rope-in-place")
"""The seven rewrites the H200 runs of 2026-11-30 and 2026-12-04 submitted as one candidate, in that order."""
DEVICE_STACK = (*STACK, "router-topk")
"""bench/h200_lcp.sh's default ``REWRITES``: the seven, then the router's top-k as argmax rounds (pattern 10),
the rewrite aimed at the glue bar at 4096 tokens."""


def stack_tree(state_dir: Path, names: tuple[str, ...]) -> Path:
    """A checkout of main plus ``names`` replayed in order, in a fresh embedded workspace under ``state_dir``."""
    import git

    from phases.local_compile_perf.workspace import materialize_embedded_workspace

    workspace = materialize_embedded_workspace(state_dir)
    replay_rewrites(workspace, list(names), branch="candidate/stack", scratch_name="stack-replay")
    tree = state_dir / "stack"
    git.Repo(workspace).git.worktree("add", "--detach", str(tree), "candidate/stack")
    return tree


def check_stack(names: tuple[str, ...], *, backend: str, state_dir: Path) -> tuple[dict, tuple[str, ...]]:
    """The build check's record and what blocks it."""
    from orchestrator.worker import run_worker
    from phases.local_compile_perf.records import ParallelBuildCheck
    from phases.local_compile_perf.tp_ep import rule
    from phases.local_compile_perf.work.tp_ep_check import ParallelCheckRequest

    tree = stack_tree(state_dir, names)
    regions = tuple(dict.fromkeys(("router", *shipped_regions(list(names)).split(","))))
    request = ParallelCheckRequest(harness="examples.moe_layer.harness:build_harness", device="cpu",
                                   regions=regions, compile_backend=backend)
    result = run_worker("phases.local_compile_perf.work.tp_ep_check:tp_ep_worker",
                        request.model_dump(mode="json"), target=tree, timeout_s=900)
    if result.answer is None:
        raise SystemExit(result.log.decode("utf-8", "replace")[-3000:])
    check = ParallelBuildCheck.model_validate(result.answer)
    blocking, _ = rule(check, None)
    return result.answer, tuple(blocking)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rewrites", default=",".join(STACK))
    parser.add_argument("--backend", default="inductor")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        check, blocking = check_stack(tuple(args.rewrites.split(",")), backend=args.backend, state_dir=Path(tmp))
    print(json.dumps({"rewrites": args.rewrites, "backend": args.backend, "status": check["status"],
                      "items": check["items"], "graphs": check["graphs"],
                      "zero_token_growth": check["zero_token_growth"], "failures": check["failures"],
                      "blocking": blocking}, indent=1))
    sys.exit(1 if blocking else 0)


if __name__ == "__main__":
    main()
