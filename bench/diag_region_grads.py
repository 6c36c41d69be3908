"""Which region breaks the grads? Region subsets of the embedded target's rewrites vs eager.

    LCP_SCALE=small python bench/diag_region_grads.py --rewrites norm-rope-cat,gather-combine [--dtype fp32]

Materializes the embedded workspace in a temporary directory, replays the shipped rewrites on
main in order (as ``bench_lcp.py --combine`` does), and in that checkout captures the output
and every grad with no region, all regions, all but one and each one alone, each replaying
eager's routing (as the correctness phase does). One line per subset: ok, or how many
tensors are off by more than the tolerance, with the worst one and both norms (a zero grad
shows as rel L2 1 and norm 0). Small dims compile in seconds on a GPU.
Exits 1 when any subset is off, so a device call can stop before a full run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(1, str(BENCH))


def checkout(rewrites: list[str], root: Path) -> Path:
    """A worktree of main plus ``rewrites``, made from a fresh embedded workspace under ``root``."""
    import git

    from bench_lcp import replay_rewrites
    from phases.local_compile_perf.workspace import materialize_embedded_workspace

    workspace = materialize_embedded_workspace(root / "state")
    replay_rewrites(workspace, rewrites, branch="diag/combined", scratch_name="diag-combine")
    tree = root / "checkout"
    git.Repo(workspace).git.worktree("add", "--detach", str(tree), "diag/combined")
    return tree


def subsets(regions: list[str]) -> dict[str, list[str]]:
    return {"eager": [], "all": regions, **{f"all but {r}": [x for x in regions if x != r] for r in regions},
            **{f"only {r}": [r] for r in regions}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rewrites", required=True, help="comma list of shipped candidates, replayed in order")
    p.add_argument("--dtype", default="fp32", choices=["bf16", "fp32"])
    p.add_argument("--tokens", type=int, default=256)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="diag_region_grads_") as tmp:
        tree = checkout(args.rewrites.split(","), Path(tmp))
        sys.path.insert(0, str(tree))  # the target's modules come from the checkout
        bad = report(args)
    sys.exit(1 if bad else 0)


def report(args: argparse.Namespace) -> list[str]:
    """Print one line per region subset; return the subsets whose grads are off."""
    import torch

    from phases.kit.correctness import BF16_ULP_REL_TOL, capture_routed, compare_captures
    from phases.kit.harness import build_tree_workload, resolve_dtype
    from phases.kit.harness import load_harness

    harness = load_harness("examples.moe_layer.harness:build_harness")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"{harness.spec.name} {args.dtype} {args.tokens} tokens on {device}, torch {torch.__version__}", flush=True)
    reference, routing, bad = None, {}, []
    for label, regions in subsets(list(harness.spec.all_regions)).items():
        started = time.monotonic()
        torch._dynamo.reset()
        tree = "regions:" + ",".join(regions) if regions else "eager"
        workload = build_tree_workload(harness, tree, tokens=args.tokens, device=device,
                                       dtype=resolve_dtype(args.dtype), seed=0)
        if reference is None:
            reference, _, routing = capture_routed(workload)
            continue
        captured = capture_routed(workload, replay=routing)[0]
        off = [d for d in compare_captures(captured, reference, label=label, tolerance=BF16_ULP_REL_TOL).diffs
               if not d.within]
        took = f"({time.monotonic() - started:.0f} s)"
        if not off:
            print(f"{label:28s} ok {took}", flush=True)
            continue
        bad.append(label)
        worst = max(off, key=lambda d: d.rel_l2)
        print(f"{label:28s} {len(off)} off; worst {worst.name} rel L2 {worst.rel_l2:.3g} "
              f"(norm {worst.norm:.4g} vs {worst.reference_norm:.4g}) {took}", flush=True)
    harness.bind_regions([])
    return bad


if __name__ == "__main__":
    main()
