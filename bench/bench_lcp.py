"""Drive a local-compile-perf run of the embedded target through the real CLI, then print ratios.

    python bench/bench_lcp.py --state-dir DIR --tokens 2048,4096,16384 --out OUTDIR [--deadline-s 540]
        [--continue] [--combine a,b,... | --branches a,b,...] [--finish]

start (or, with ``--continue``/``--resume``, the run the state dir holds) -> advance (plan .. rank,
waits in pick_fix) -> one ``orchestrator candidate`` per shipped branch, in the order of
``--branches`` (or one for ``--combine``'s rewrites) -> with ``--finish``: ``candidates=done``
(findings) -> ``open_prs=no`` -> audit. Each step starts from where the run stands, so a call cut
at its deadline is continued by the same command: a run cut mid-phase is advanced, a branch
already submitted is not submitted again (``next_action``). A refused start prints the refusal
and exits with its code. Prints ratios (stack / upstream, stack glue / per-layer glue,
confirmation spread) and every cited median read back from the run's trail, and copies the run
directory (as a tar) and its key artifacts to OUTDIR.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # NOTE: the phases package, when run as `python bench/bench_lcp.py`
SHIPPED = {
    "norm-rope-cat": "MLA q/k glue in one region",
    "narrow-scores": "routing weights on the narrow SwiGLU output",
    "gather-combine": "MoE dispatch and combine as gathers",
    "mlp-swiglu": "dense and shared SwiGLU activation as a region",
    "residual-norm": "residual add fused into the ffn norm",
    "real-rope": "real-arithmetic RoPE",
    "latent-proj": "MLA input projections as one GEMM",
    "rope-in-place": "query RoPE rotated in place",
    "gemm-grad-sum": "SwiGLU input grads summed in the GEMMs",
    "residual-gemm": "second residual add in the ffn's last GEMM",
    "router-topk": "group-limited top-k as argmax rounds in the router region",
}
"""Shipped candidate branches (``candidate/<name>``) and their labels, in the default order.

NOTE: residual-norm after norm-rope-cat: before it, the norm region also sees the q and kv
latent widths and hits the recompile limit (the H200 run rejected it so)."""


class Stopped(Exception):
    """The call stopped at a phase boundary: the phase that just started cannot finish before the deadline."""


def cli(*args: str, state_dir: Path, timeout: float, stop: Callable[[], str] | None = None) -> tuple[int, dict]:
    """One CLI call, killed at ``timeout`` (TimeoutExpired) or when ``stop()`` says why (Stopped)."""
    command = [sys.executable, "-m", "orchestrator.cli", *args, "--json", "--state-dir", str(state_dir)]
    started = time.monotonic()
    # NOTE: its own session, so a cut at the deadline also kills the phase's workers (they hold the GPU).
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            start_new_session=True)
    while True:
        try:
            stdout, stderr = proc.communicate(timeout=min(POLL_S, max(0.0, started + timeout - time.monotonic())))
            break
        except subprocess.TimeoutExpired:
            why = stop() if stop else ""
            if why or time.monotonic() >= started + timeout:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                if why:
                    raise Stopped(why) from None
                raise subprocess.TimeoutExpired(command, time.monotonic() - started) from None
    took = time.monotonic() - started
    print(f"$ orchestrator {' '.join(args)} -> exit {proc.returncode} in {took:.0f} s", flush=True)
    try:
        return proc.returncode, json.loads(stdout or "{}")
    except ValueError:
        print(stdout[-2000:], stderr[-4000:], flush=True)
        return proc.returncode, {}


POLL_S = 2.0
"""How often a running CLI call's run.json is read for the phase it started."""
PHASE_S = {"plan": 20, "baselines": 470, "ideal_times": 50, "profile_diff": 10, "rank": 10, "pick_fix": 10,
           "graph_budget": 110, "screen_confirm": 290, "correctness": 250, "commit_scope": 15, "findings": 1800,
           "feedback": 10}
"""Seconds each phase takes on one H100 at the device script's sizes (the H200 trail of 2026-12-04 plus 15%, the
H100 try of issue 38): a call stops before a phase it cannot finish (``phase_stop``); one longer than a whole call
(findings) runs until the deadline and is continued where it was cut."""


def phase_stop(state_dir: Path, run_id: str, *, deadline: float, call_s: float, call_started: float,
               phase_s: dict[str, float]) -> Callable[[], str]:
    """``stop`` for ``cli``: why to stop now, "" to go on. A phase attempt that starts during the call (not its
    first work) and is expected to outlast the deadline, though it would fit a whole call, stops the call there:
    the next call runs it whole instead of cutting it."""
    started = read_run(state_dir, run_id).get("attempts", {})
    judged = {(phase, attempt) for phase, attempt in started.items()}

    def stop() -> str:
        try:
            run = read_run(state_dir, run_id)
        except (OSError, ValueError):
            return ""
        phase, now = run.get("in_flight"), time.monotonic()
        attempt = (phase, run.get("attempts", {}).get(phase))
        if not phase or attempt in judged:
            return ""
        judged.add(attempt)  # NOTE: judged once, as it starts: a phase allowed to run is never stopped midway
        need, left = phase_s.get(phase, 0.0), deadline - now
        if now - call_started >= 30 and left < need <= call_s:
            return f"stopping before {phase}: it takes about {need:.0f} s, {left:.0f} s are left in this call"
        return ""

    return stop


def drive(args: argparse.Namespace) -> str | None:
    """Take the run as far as the options ask before the deadline; the run's id (None: nothing started).

    Every step picks up where an earlier call left the state dir: a run cut mid-phase is advanced
    first (the engine reruns the phase, and its fresh processes that finished are not measured
    again: kit journal), a branch already submitted is not submitted again, and an answer already
    given is not asked for again. So one command, repeated, takes the run to its end.
    """
    started = time.monotonic()
    deadline = started + args.deadline_s
    run_id = args.resume or (existing_run(args.state_dir) if args.continue_run else "")
    if run_id:
        print(f"continuing run {run_id} in {args.state_dir}", flush=True)
    else:
        run_id = start_run(args)
    todo = [args.combine_branch] if args.combine else [b for b in args.branches.split(",") if b]
    seen, failed = -1, None
    while True:
        run = read_run(args.state_dir, run_id)
        if run["last_seq"] == seen:
            print(f"run {run_id} did not move in {run['phase']} ({run['status']}): {run['summary']}", flush=True)
            break
        seen, left = run["last_seq"], deadline - time.monotonic()
        action = next_action(run, todo=todo, tried=tried_branches(args.state_dir, run_id), finish=args.finish)
        if action is None:
            break
        if action[0] == "candidate" and left < args.candidate_s:
            print(f"deadline: {left:.0f} s left, less than a candidate's {args.candidate_s:.0f} s; "
                  f"not submitted: {action[1]}", flush=True)
            break
        stop = phase_stop(args.state_dir, run_id, deadline=deadline, call_s=args.deadline_s, call_started=started,
                          phase_s=args.phase_s)
        try:
            rc = take(args, run_id, action, timeout=max(60.0, left), stop=stop)
        except Stopped as why:
            print(f"{why}; the next call starts it", flush=True)
            break
        where = (action, read_run(args.state_dir, run_id).get("in_flight"))
        if rc == 1 and where == failed:
            print(f"{action[0]} failed twice in {where[1]}: stopping (the CLI's --debug shows the traceback)",
                  flush=True)
            break
        failed = where if rc == 1 else None
    if read_run(args.state_dir, run_id)["status"] == "done":
        rc, audit = cli("audit", run_id, state_dir=args.state_dir, timeout=120)
        print(f"audit: ok={audit.get('ok')} findings={audit.get('findings')}", flush=True)
    return run_id


def next_action(run: dict, *, todo: list[str], tried: set[str], finish: bool) -> tuple[str, str] | None:
    """What to do next with ``run`` (its run.json): ("advance", ""), ("candidate", NAME), ("answer", KEY=VALUE),
    or None when the options ask for nothing more (done, failed, or waiting where they stop)."""
    if run["status"] in ("done", "failed", "aborted"):
        return None
    if run.get("in_flight") or run["status"] == "running":
        return ("advance", "")
    pending = {q["key"] for q in run.get("pending", [])}
    if run["phase"] == "pick_fix" and run["awaiting"] == "agent":
        left = [name for name in todo if f"candidate/{name}" not in tried]
        if left:
            return ("candidate", left[0])
        return ("answer", "candidates=done") if finish else None
    if "open_prs" in pending and finish:
        return ("answer", "open_prs=no")
    print(f"run waits in {run['phase']} for the {run['awaiting']}: {run['summary']}", flush=True)
    return None


def take(args: argparse.Namespace, run_id: str, action: tuple[str, str], *, timeout: float,
         stop: Callable[[], str] | None = None) -> int:
    """One CLI call for ``action`` (next_action's), printed with its exit code and where the run went; the code."""
    kind, what = action
    if kind == "advance":
        rc, out = cli("advance", run_id, state_dir=args.state_dir, timeout=timeout, stop=stop)
    elif kind == "answer":
        rc, out = cli("resume", run_id, "--answer", what, state_dir=args.state_dir, timeout=timeout, stop=stop)
    else:
        if args.combine:
            combine_branches(args.state_dir, run_id, args.combine.split(","), branch=what)
        regions = shipped_regions(args.combine.split(",") if args.combine else [what])
        rc, out = cli("candidate", run_id, "--branch", f"candidate/{what}", "--label", SHIPPED[what],
                      "--regions", regions, state_dir=args.state_dir, timeout=timeout, stop=stop)
    said = (out.get("error") or {}).get("message") or out.get("summary")
    print(f"{kind} {what}: exit {rc}, phase {out.get('phase')}: {said}", flush=True)
    return rc


def start_run(args: argparse.Namespace) -> str:
    """A new run's id; a refused start prints the refusal and exits with its code (nothing was written)."""
    timing = ["--warmup", str(args.warmup), "--iters", str(args.iters), "--profile-steps", str(args.profile_steps)]
    extra = [part for option in args.start_option for part in ("--" + option.partition("=")[0],
                                                                option.partition("=")[2])]
    rc, out = cli("start", "local-compile-perf", "--target", "embedded", "--tokens", args.tokens, *timing,
                  *(["--per-layer-tokens", args.per_layer_tokens] if args.per_layer_tokens else []), *extra,
                  state_dir=args.state_dir, timeout=300)
    if rc != 0 or "run_id" not in out:
        message = (out.get("error") or {}).get("message", "no run id in its answer")
        print(f"start refused (exit {rc}): {message}", flush=True)
        raise SystemExit(rc or 1)
    return out["run_id"]


def existing_run(state_dir: Path) -> str:
    """The run the state dir holds ("" when none; the newest when several)."""
    runs = state_dir / "runs"
    return latest_run(state_dir) if runs.is_dir() and any(runs.iterdir()) else ""


def read_run(state_dir: Path, run_id: str) -> dict:
    return json.loads((state_dir / "runs" / run_id / "run.json").read_text())


def shipped_regions(names: list[str]) -> str:
    """The regions the shipped rewrites ``names`` name in their meta.json, as ``--regions`` takes them."""
    from phases.local_compile_perf.workspace import candidate_regions

    named = candidate_regions()
    regions = dict.fromkeys(r for name in names for r in named[f"candidate/{name}"])
    return ",".join(regions) or "none"


def combine_branches(state_dir: Path, run_id: str, names: list[str], *, branch: str = "combined") -> None:
    """Branch ``candidate/<branch>`` of the run's target: the named rewrites replayed on main, in order.

    One submission for several rewrites, when device time allows one confirmation only; the
    findings then hold one stack entry for all of them (its label says so).
    """
    run = json.loads((state_dir / "runs" / run_id / "run.json").read_text())
    replay_rewrites(Path(run["target"]), names, branch=f"candidate/{branch}", scratch_name=f"{run_id}-combine")
    SHIPPED[branch] = "rewrites " + " + ".join(names)
    print(f"candidate/{branch}: {' + '.join(names)} on main", flush=True)


def replay_rewrites(target: Path, names: list[str], *, branch: str, scratch_name: str) -> None:
    """Point ``branch`` of the ``target`` repo at main plus ``candidate/<name>`` cherry-picked in order."""
    import git

    from phases.local_compile_perf.workspace import replay

    repo = git.Repo(target)
    scratch = target.with_name(scratch_name)
    if scratch.exists():  # NOTE: left by a call cut mid-replay
        repo.git.worktree("remove", "--force", str(scratch))
    repo.git.worktree("prune")
    repo.git.worktree("add", "--detach", str(scratch), "main")
    try:
        tree = git.Repo(scratch)
        replay(tree, [f"candidate/{name}" for name in names])
        repo.git.branch("-f", branch, tree.head.commit.hexsha)
    finally:
        repo.git.worktree("remove", "--force", str(scratch))


def tried_branches(state_dir: Path, run_id: str) -> set[str]:
    run = json.loads((state_dir / "runs" / run_id / "run.json").read_text())
    return {v.get("branch", "") for v in run["records"].get("candidate_verdict", [])}


def latest_run(state_dir: Path) -> str:
    return sorted((state_dir / "runs").iterdir(), key=lambda p: p.stat().st_mtime)[-1].name


def report(state_dir: Path, run_id: str) -> None:
    """Ratios from the trail: every number printed comes from a recorded measurement."""
    run = json.loads((state_dir / "runs" / run_id / "run.json").read_text())
    events = [json.loads(l) for l in (state_dir / "runs" / run_id / "events.jsonl").read_text().splitlines()]
    print(f"run {run_id}: phase {run['phase']}, status {run['status']}: {run['summary']}")
    bw = [e for e in events if e["type"] == "measurement_recorded" and e["data"]["name"] == "bandwidth_tbs"]
    if bw:
        print(f"bandwidth: {bw[-1]['data']['samples'][0]:.3f} TB/s ({bw[-1]['data']['labels']['label']})")
    cited = [e["data"] for e in events if e["type"] == "measurement_recorded" and e["data"]["labels"].get("cited")]
    medians = [(m["samples"], statistics.median(m["samples"])) for m in cited if m["name"] == "wall_ms"]
    spreads = [max(abs(s - median) for s in samples) / median * 100 for samples, median in medians if median]
    if spreads:
        print(f"confirmation spread (wall, max |run - median| / median): worst {max(spreads):.2f}%, "
              f"median {statistics.median(spreads):.2f}% over {len(spreads)} cited rows")
    for (purpose, variant, tokens), metrics in cited_medians(events).items():
        print(f"cited {purpose} {variant} at {tokens}: wall {metrics.get('wall_ms', float('nan')):.2f} ms, "
              f"glue {metrics.get('glue_ms', float('nan')):.2f} ms")
    for entry in run["records"].get("stack_entry", []):
        for j in entry["judged"]:
            ratio = j['candidate'] / j['stack']
            print(f"{entry['branch']} at {j['tokens']}: candidate/stack = {ratio:.3f} ({j['verdict']})")
    for v in run["records"].get("candidate_verdict", []):
        print(f"verdict {v['label']}: {v['verdict']} at {v['phase']}: {v['reason']}")
    per_tokens = run["results"].get("findings", {}).get("per_tokens", [])
    for t in per_tokens:
        if t["upstream"] and t["stack"]:
            print(f"{t['tokens']} tokens: stack/upstream wall = {t['stack']['wall_ms'] / t['upstream']['wall_ms']:.3f}")
        if t["per_layer"] and t["stack"]:
            ratio = t['stack']['glue_ms'] / t['per_layer']['glue_ms']
            print(f"{t['tokens']} tokens: stack glue / per-layer glue = {ratio:.3f}")


def cited_medians(events: list[dict]) -> dict[tuple[str, str, int], dict[str, float]]:
    """The last cited median of each metric per (purpose, variant, tokens): in the log, the numbers
    outlive a state that could not come back."""
    table: dict[tuple[str, str, int], dict[str, float]] = {}
    for e in events:
        labels = e["data"]["labels"] if e["type"] == "measurement_recorded" else {}
        if labels.get("cited") and "variant" in labels:
            key = (labels.get("purpose", ""), labels["variant"], labels.get("tokens", 0))
            table.setdefault(key, {})[e["data"]["name"]] = statistics.median(e["data"]["samples"])
    return table


def save(state_dir: Path, run_id: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    run_dir = state_dir / "runs" / run_id
    with tarfile.open(out / "run.tar.gz", "w:gz") as tar:
        tar.add(run_dir, arcname=run_id)
    for name in ("FINDINGS.md", "devlog.md", "baselines.md", "ideal_times.md", "ranked.md", "skill_feedback.md"):
        if (run_dir / "artifacts" / name).is_file():
            (out / name).write_bytes((run_dir / "artifacts" / name).read_bytes())


def phase_seconds(text: str) -> dict[str, float]:
    """PHASE_S updated by "phase=seconds,..."."""
    pairs = [item.partition("=") for item in text.split(",") if item.strip()]
    return {**PHASE_S, **{name.strip(): float(value) for name, _eq, value in pairs}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--state-dir", type=Path, required=True)
    p.add_argument("--tokens", default="2048,4096,16384")
    p.add_argument("--per-layer-tokens", default="")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--deadline-s", type=float, default=540.0)
    p.add_argument("--candidate-s", type=float, default=90.0,
                   help="time one candidate needs, to stop before the deadline")
    p.add_argument("--branches", default=",".join(SHIPPED), help=f"comma list, in order, of: {', '.join(SHIPPED)}")
    p.add_argument("--resume", default="", help="RUN id in --state-dir to continue (from wherever it stopped)")
    p.add_argument("--continue", dest="continue_run", action="store_true",
                   help="continue the run --state-dir holds, if any, instead of starting one")
    p.add_argument("--combine", default="", help="comma list of shipped rewrites submitted as ONE candidate/combined")
    p.add_argument("--combine-branch", default="combined",
                   help="name of the combined branch (another name submits the same rewrites again)")
    p.add_argument("--finish", action="store_true",
                   help="then answer candidates=done and open_prs=no (findings runs between them), and audit")
    p.add_argument("--phase-s", type=phase_seconds, default=PHASE_S, metavar="PHASE=S,...",
                   help="seconds each phase takes here (a call stops before one it cannot finish); "
                        "default: " + ",".join(f"{k}={v}" for k, v in PHASE_S.items()))
    p.add_argument("--start-option", action="append", default=[], metavar="NAME=VALUE",
                   help="another option of `orchestrator start` (e.g. rewrite-deltas=no), repeated")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--profile-steps", type=int, default=5)
    args = p.parse_args()
    unknown = [b for b in (args.branches + "," + args.combine).split(",") if b and b not in SHIPPED]
    if unknown:
        p.error(f"--branches: unknown {unknown}; shipped: {', '.join(SHIPPED)}")
    try:
        run_id = drive(args)
    except subprocess.TimeoutExpired as exc:
        print(f"deadline: {' '.join(exc.cmd[3:5])} cut after {exc.timeout:.0f} s; saving what the trail holds")
        run_id = latest_run(args.state_dir)
    report(args.state_dir, run_id)
    save(args.state_dir, run_id, args.out)


if __name__ == "__main__":
    main()
