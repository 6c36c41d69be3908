"""Drive a local-compile-perf run of the embedded target through the real CLI, then print ratios.

    python bench/bench_lcp.py --state-dir DIR --tokens 2048,4096,16384 --out OUTDIR [--deadline-s 540]

start -> advance (plan .. rank, waits in pick_fix) -> one ``orchestrator candidate`` per
shipped branch (real-rope, narrow-scores, norm-rope-cat) -> ``candidates=done`` ->
``open_prs=no`` -> audit. Stops submitting when the deadline is near and says so. Prints
ratios (stack / upstream, stack glue / per-layer glue, confirmation spread) read back from
the run's trail, and copies the run directory (as a tar) and its key artifacts to OUTDIR.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = (("candidate/real-rope", "real-arithmetic RoPE"), ("candidate/narrow-scores", "routing weights on the narrow SwiGLU output"),
           ("candidate/norm-rope-cat", "MLA q/k glue in one region"))


def cli(*args: str, state_dir: Path, timeout: float) -> tuple[int, dict]:
    command = [sys.executable, "-m", "orchestrator.cli", *args, "--json", "--state-dir", str(state_dir)]
    started = time.monotonic()
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    print(f"$ orchestrator {' '.join(args)} -> exit {proc.returncode} in {time.monotonic() - started:.0f} s", flush=True)
    try:
        return proc.returncode, json.loads(proc.stdout or "{}")
    except ValueError:
        print(proc.stdout[-2000:], proc.stderr[-4000:], flush=True)
        return proc.returncode, {}


def drive(args: argparse.Namespace) -> str:
    deadline = time.monotonic() + args.deadline_s
    rc, out = cli("start", "local-compile-perf", "--target", "embedded", "--tokens", args.tokens,
                  *(["--per-layer-tokens", args.per_layer_tokens] if args.per_layer_tokens else []),
                  state_dir=args.state_dir, timeout=300)
    run_id = out["run_id"]
    rc, out = cli("advance", run_id, state_dir=args.state_dir, timeout=max(60.0, deadline - time.monotonic()))
    print(f"advance: phase {out.get('phase')}: {out.get('summary')}", flush=True)
    if rc != 4:
        print(f"run stopped in {out.get('phase')}: {out.get('summary')}")
        return run_id
    for branch, label in SHIPPED:
        left = deadline - time.monotonic()
        if left < args.candidate_s:
            print(f"deadline: {left:.0f} s left, less than a candidate's {args.candidate_s:.0f} s; {branch} not submitted")
            break
        rc, out = cli("candidate", run_id, "--branch", branch, "--label", label, state_dir=args.state_dir, timeout=left)
        print(f"candidate {branch}: exit {rc}, phase {out.get('phase')}", flush=True)
    cli("resume", run_id, "--answer", "candidates=done", state_dir=args.state_dir, timeout=120)
    cli("resume", run_id, "--answer", "open_prs=no", state_dir=args.state_dir, timeout=120)
    rc, audit = cli("audit", run_id, state_dir=args.state_dir, timeout=120)
    print(f"audit: ok={audit.get('ok')} findings={audit.get('findings')}", flush=True)
    return run_id


def report(state_dir: Path, run_id: str) -> None:
    """Ratios from the trail: every number printed comes from a recorded measurement."""
    run = json.loads((state_dir / "runs" / run_id / "run.json").read_text())
    events = [json.loads(l) for l in (state_dir / "runs" / run_id / "events.jsonl").read_text().splitlines()]
    print(f"run {run_id}: phase {run['phase']}, status {run['status']}: {run['summary']}")
    bw = [e for e in events if e["type"] == "measurement_recorded" and e["data"]["name"] == "bandwidth_tbs"]
    if bw:
        print(f"bandwidth: {bw[-1]['data']['samples'][0]:.3f} TB/s ({bw[-1]['data']['labels']['label']})")
    cited = [e["data"] for e in events if e["type"] == "measurement_recorded" and e["data"]["labels"].get("cited")]
    spreads = [max(abs(s - statistics.median(m["samples"])) for s in m["samples"]) / statistics.median(m["samples"]) * 100
               for m in cited if m["name"] == "wall_ms" and statistics.median(m["samples"])]
    if spreads:
        print(f"confirmation spread (wall, max |run - median| / median): worst {max(spreads):.2f}%, "
              f"median {statistics.median(spreads):.2f}% over {len(spreads)} cited rows")
    for entry in run["records"].get("stack_entry", []):
        for j in entry["judged"]:
            print(f"{entry['branch']} at {j['tokens']}: candidate/stack = {j['candidate'] / j['stack']:.3f} ({j['verdict']})")
    for v in run["records"].get("candidate_verdict", []):
        print(f"verdict {v['label']}: {v['verdict']} at {v['phase']}: {v['reason']}")
    per_tokens = run["results"].get("findings", {}).get("per_tokens", [])
    for t in per_tokens:
        if t["upstream"] and t["stack"]:
            print(f"{t['tokens']} tokens: stack/upstream wall = {t['stack']['wall_ms'] / t['upstream']['wall_ms']:.3f}")
        if t["per_layer"] and t["stack"]:
            print(f"{t['tokens']} tokens: stack glue / per-layer glue = {t['stack']['glue_ms'] / t['per_layer']['glue_ms']:.3f}")


def save(state_dir: Path, run_id: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    run_dir = state_dir / "runs" / run_id
    with tarfile.open(out / "run.tar.gz", "w:gz") as tar:
        tar.add(run_dir, arcname=run_id)
    for name in ("FINDINGS.md", "devlog.md", "baselines.md", "ideal_times.md", "ranked.md", "skill_feedback.md"):
        if (run_dir / "artifacts" / name).is_file():
            (out / name).write_bytes((run_dir / "artifacts" / name).read_bytes())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--state-dir", type=Path, required=True)
    p.add_argument("--tokens", default="2048,4096,16384")
    p.add_argument("--per-layer-tokens", default="")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--deadline-s", type=float, default=540.0)
    p.add_argument("--candidate-s", type=float, default=90.0, help="time one candidate needs, to stop before the deadline")
    args = p.parse_args()
    try:
        drive(args)
    except subprocess.TimeoutExpired as exc:
        print(f"deadline: {' '.join(exc.cmd[3:5])} cut after {exc.timeout:.0f} s; saving what the trail holds")
    runs = sorted((args.state_dir / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
    run_id = runs[-1].name
    report(args.state_dir, run_id)
    save(args.state_dir, run_id, args.out)


if __name__ == "__main__":
    main()
