"""Glue kernel time of several code variants, one fresh process each, spread over the visible GPUs.

    python bench/diag/variant_glue.py --variant s5=DIR:regions:a,b --variant main=DIR2:per_layer \\
        --tokens 4096,16384 --gpus 0,1 --out glue.json

Each variant is a checkout (a folder holding ``examples/moe_layer``) and a tree as
``measure_trees`` takes it. Each runs as ``python -m phases.local_compile_perf.work.measure_trees``
in its checkout on one GPU (a queue per GPU, variants dealt round-robin), so two GPUs halve
the wall time without sharing a device. Diagnostic, not a cited number: one process per
variant. Prints wall and glue per token count, then the glue kernels of each variant, largest
first, with the change against the first variant.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from phases.kit.harness import TimingKnobs  # noqa: E402
from phases.kit.records import GLUE_EXCLUDED, KernelTable  # noqa: E402
from phases.local_compile_perf.work.measure_trees import RESULT_PREFIX, TreeRequest  # noqa: E402


def parse_variant(text: str) -> tuple[str, Path, str]:
    name, _, rest = text.partition("=")
    checkout, _, tree = rest.partition(":")
    if not (name and checkout and tree):
        raise SystemExit(f"--variant {text!r}: expected NAME=CHECKOUT:TREE")
    return name, Path(checkout).resolve(), tree


def measure(name: str, checkout: Path, tree: str, *, tokens: tuple[int, ...], timing: TimingKnobs,
            gpu: str, device: str, tmp: Path) -> dict:
    request = tmp / f"{name}.json"
    request.write_text(TreeRequest(harness="examples.moe_layer.harness:build_harness", tree=tree, tokens=tokens,
                                   device=device, timing=timing).model_dump_json())
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(checkout), str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "phases.local_compile_perf.work.measure_trees",
                           "--request", str(request)], cwd=checkout, env=env, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if proc.returncode or not lines:
        return {"name": name, "tree": tree, "gpu": gpu, "failed": (proc.stderr or proc.stdout)[-3000:]}
    return {"name": name, "tree": tree, "gpu": gpu, "result": json.loads(lines[-1][len(RESULT_PREFIX):])}


def glue_ms(result: dict) -> float:
    """Glue ms per step, from the family sums (the table's rows are only its largest kernels)."""
    return KernelTable.model_validate(result["kernels"]).glue_ms_per_step


def glue_rows(result: dict) -> dict[str, float]:
    """The largest glue kernels the table kept: name -> us per step."""
    return {r["name"]: r["us_per_step"] for r in result["kernels"]["rows"] if r["family"] not in GLUE_EXCLUDED}


def one_line(run: dict, tokens: tuple[int, ...]) -> str:
    if "failed" in run:
        return "FAILED"
    return ", ".join(f"{t}: wall {run['result'][str(t)]['wall_ms']:.3f} glue "
                     f"{glue_ms(run['result'][str(t)]):.3f} ms" for t in tokens)


def summarize(runs: list[dict], tokens: tuple[int, ...]) -> None:
    ok = [r for r in runs if "result" in r]
    for r in runs:
        if "failed" in r:
            print(f"{r['name']}: FAILED\n{r['failed']}")
    for t in tokens:
        print(f"\n== {t} tokens: wall ms / glue ms (kernels/step)")
        base = None
        for r in ok:
            res = r["result"][str(t)]
            glue = glue_ms(res)
            base = glue if base is None else base
            print(f"  {r['name']:<14} wall {res['wall_ms']:8.3f}  glue {glue:7.3f} ({(glue / base - 1) * 100:+5.1f}%)"
                  f"  kernels {res['kernel_count']:.0f}")
    t = max(tokens)
    first = glue_rows(ok[0]["result"][str(t)]) if ok else {}
    for r in ok:
        rows = glue_rows(r["result"][str(t)])
        print(f"\n-- {r['name']} glue kernels at {t} tokens (us/step, vs {ok[0]['name']})")
        for kname, us in sorted(rows.items(), key=lambda kv: -kv[1])[:30]:
            print(f"  {us:9.1f} {us - first.get(kname, 0.0):+9.1f}  {kname[:110]}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--variant", action="append", required=True, help="NAME=CHECKOUT:TREE")
    p.add_argument("--tokens", default="4096,16384")
    p.add_argument("--gpus", default="0")
    p.add_argument("--device", default="cuda")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=8)
    p.add_argument("--profile-steps", type=int, default=2)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--deadline-s", type=float, default=0.0, help="start no variant after this many seconds (0: none)")
    args = p.parse_args()
    variants = [parse_variant(v) for v in args.variant]
    tokens = tuple(int(t) for t in args.tokens.split(","))
    timing = TimingKnobs(warmup=args.warmup, iters=args.iters, profile_steps=args.profile_steps)
    gpus = args.gpus.split(",")
    runs: list[dict | None] = [None] * len(variants)
    deadline = time.monotonic() + args.deadline_s if args.deadline_s else float("inf")
    lock = threading.Lock()

    def queue(gpu_index: int) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(gpu_index, len(variants), len(gpus)):
                name, checkout, tree = variants[i]
                if time.monotonic() > deadline:
                    print(f"[gpu {gpus[gpu_index]}] {name}: not started (deadline)", flush=True)
                    continue
                print(f"[gpu {gpus[gpu_index]}] {name}: {tree} in {checkout}", flush=True)
                runs[i] = measure(name, checkout, tree, tokens=tokens, timing=timing, gpu=gpus[gpu_index],
                                  device=args.device, tmp=Path(tmp))
                print(f"[gpu {gpus[gpu_index]}] {name}: {one_line(runs[i], tokens)}", flush=True)
                with lock:  # NOTE: after every variant, so a cut run keeps what it measured
                    args.out.write_text(json.dumps([r for r in runs if r is not None]))

    threads = [threading.Thread(target=queue, args=(g,)) for g in range(len(gpus))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    done = [r for r in runs if r is not None]
    args.out.write_text(json.dumps(done))
    summarize(done, tokens)


if __name__ == "__main__":
    main()
