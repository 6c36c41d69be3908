"""The findings' glue-op table for one checkout, outside a run: each region op timed alone.

    PYTHONPATH=CHECKOUT:. python bench/diag/glue_ops.py --regions a,b --tokens 16384 --out ops.json

Runs ``measure_glue_worker`` in this process (the checkout's ``examples.moe_layer`` harness)
and prints each op as ``stack_code.judge_op`` reads it. The bandwidth is the device's HBM
copy probe (kit), measured here too.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from phases.kit.bandwidth import bandwidth_worker
from phases.kit.harness import TimingKnobs
from phases.local_compile_perf.stack_code import judge_op
from phases.local_compile_perf.work.glue import GlueRequest, measure_glue_worker


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--regions", required=True)
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    req = GlueRequest(harness="examples.moe_layer.harness:build_harness", device=args.device, tokens=args.tokens,
                      regions=tuple(args.regions.split(",")), timing=TimingKnobs(warmup=3, iters=8, profile_steps=2))
    answer = measure_glue_worker(req.model_dump(mode="json"))
    bandwidth = bandwidth_worker({"device": args.device})
    args.out.write_text(json.dumps({"glue": answer, "bandwidth": bandwidth}))
    tbs = bandwidth["tbs"]
    print(f"bandwidth {tbs:.3f} TB/s; compiled one-element add {answer['call_floor_ms']} ms a call")
    for op in answer["ops"]:
        j = judge_op(op, tbs, [], floor_ms=answer["call_floor_ms"])
        ratio = f"{j['ratio']:.1f}x" if j["ratio"] else "n/a"
        print(f"{j['op']:<14} {j['timer']:<6} {j['measured_ms']:8.4f} ms/step  ideal {j['ideal_ms']:8.4f}  {ratio:>6}  "
              f"host call {min(op['fwdbwd_ms'] or op['fwd_ms']):.4f} ms  {j['blocker'] or 'reached'}")


if __name__ == "__main__":
    main()
