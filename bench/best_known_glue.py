"""The embedded DSv3 layer's glue ops beside their best-known kernels, eager and compiled, on one device.

    python bench/best_known_glue.py --tokens 4096,16384 --out OUT

Runs the glue worker in this process (one harness build per token count and mode): each op
timed alone, its best-known kernel timed on the same arguments (phases/local_compile_perf/
work/best_known.py), once with every region eager and once with main's regions compiled.
Prints one line per op (device ms/step of the op's kernels against the best-known kernel's) and
writes OUT/best_known.json with every sample.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from phases.kit.harness import TimingKnobs
from phases.local_compile_perf.work.best_known import describe, per_call_ms
from phases.local_compile_perf.work.glue import GlueRequest, measure_glue_worker

HARNESS = "phases.local_compile_perf.embedded.moe_layer.harness:build_harness"
REGIONS = ("rms_norm", "swiglu", "rope", "router")


def line(mode: str, tokens: int, op: dict) -> str:
    calls = op["calls_per_step"]
    ours = (op["device_ms"] if op["device_ms"] is not None else statistics.median(op["fwdbwd_ms"] or op["fwd_ms"]))
    best = per_call_ms(op["best_known"], device_time=op["device_ms"] is not None)
    ratio = f"{best / ours:.2f}x of ours" if best is not None and ours else "-"
    best_text = f"{best * calls:.4f}" if best is not None else "-"
    return (f"{tokens:>6} {mode:<8} {op['op']:<10} ours {ours * calls:.4f} ms/step  best-known {best_text} ms/step "
            f"({ratio}): {describe(op['best_known'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="4096,16384")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    answers = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        for mode, regions in (("eager", ()), ("compiled", REGIONS)):
            request = GlueRequest(harness=HARNESS, tokens=tokens, device=args.device, regions=regions,
                                  timing=TimingKnobs(warmup=3, iters=10))
            answer = measure_glue_worker(request.model_dump(mode="json"))
            answers.append({"mode": mode, **answer})
            for op in answer["ops"]:
                print(line(mode, tokens, op), flush=True)
            (args.out / "best_known.json").write_text(json.dumps(answers, indent=1))  # kept if a later cell is cut


if __name__ == "__main__":
    main()
