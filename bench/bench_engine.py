"""Engine benchmarks: ratios measured side by side in one run (this machine is noisy).

    python bench/bench_engine.py [--events 100000]

1. `orchestrator status --json` wall time vs `python -c pass`, interleaved (goal <= 2x)
2. events appended per second through the engine's own API, one event per write (its Ed25519-signed
   head on its line and in the anchor; one fsync), vs a bare fsync'd JSONL append: rounds side by
   side, the ratio is the median of the rounds' ratios                (goal >= 0.5 of it);
   beside them the same writes signed through OpenSSL instead of libsodium, the same syscalls
   without any of our code (the ceiling of this design on this disk) and the two syncs of the design
   before (anchor fdatasync'd, then the line fsync'd), and the CPU time per write (the part of the
   engine's cost that the disk's speed does not change)
3. `orchestrator audit` on a run of N events, signed head included (goal <= 2 s for 100,000)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.trail import events as ev  # noqa: E402
from orchestrator.trail.store import RunStore  # noqa: E402


def wall(command: list[str], *, repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run(command, check=False, capture_output=True, cwd=ROOT)
        samples.append(time.perf_counter() - started)
    return samples


def measurement(i: int) -> ev.MeasurementRecorded:
    return ev.MeasurementRecorded(name="wall_ms", unit="ms", samples=[float(i), 1.5],
                                  labels={"i": i}, provenance={"device": "cpu"})


def make_run(state_dir: Path, n_events: int, *, batch: int = 1, cpu: list[float] | None = None) -> tuple[str, float]:
    """A run of ``n_events`` appended through OpenRun, ``batch`` events per fsync; the process's (user, system)
    CPU seconds per event appended to ``cpu``: user time is our code's, which the disk's speed does not change."""
    store = RunStore(state_dir)
    run_id = "bench-run"
    store.create_run(run_id, ev.RunStarted(workflow="bench", target=str(ROOT), options={}, base={},
                                           initial_phase="p"))
    with store.open_run(run_id) as run:
        started, cpu_started = time.perf_counter(), _cpu()
        for i in range(0, n_events - 1, batch):
            run.append_many([measurement(j) for j in range(i, min(i + batch, n_events - 1))], phase="p")
        seconds = time.perf_counter() - started
        if cpu is not None:
            cpu.append(tuple((now - then) / (n_events - 1) for now, then in zip(_cpu(), cpu_started)))
    return run_id, (n_events - 1) / seconds


def _cpu() -> tuple[float, float]:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


def bare_fsync_rate(path: Path, n: int) -> float:
    """The floor: a hash-chained JSONL line written and fsynced, nothing else."""
    import hashlib
    import os

    prev = "0" * 64
    with open(path, "ab") as handle:
        started = time.perf_counter()
        for i in range(n):
            line = f'{{"i":{i},"prev":"{prev}"}}'.encode()
            prev = hashlib.sha256(line).hexdigest()
            handle.write(line + b"\n")
            handle.flush()
            os.fsync(handle.fileno())
        return n / (time.perf_counter() - started)


def syncs_rate(tmp: Path, n: int, *, head_synced: bool) -> float:
    """The engine's syscalls for one write, no code: a 512-byte record rewritten in place at offset 0
    (+ fdatasync when ``head_synced``: the design before in-log heads), then a line appended + fsync."""
    import os

    head, log = tmp / "syncs.head", tmp / "syncs.jsonl"
    head.write_bytes(b" " * 512)
    record, line = b"h" * 512, b"x" * 400 + b"\n"
    head_fd, log_fd = os.open(head, os.O_WRONLY), os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        started = time.perf_counter()
        for _ in range(n):
            os.pwrite(head_fd, record, 0)
            if head_synced:
                os.fdatasync(head_fd)
            os.write(log_fd, line)
            os.fsync(log_fd)
        return n / (time.perf_counter() - started)
    finally:
        os.close(head_fd)
        os.close(log_fd)
        head.unlink()
        log.unlink()


def signed_through_openssl(measure: Callable[[], float]) -> float:
    """``measure()`` with the writer's key signing through OpenSSL (``cryptography``, the signer before
    libsodium) instead: the same Ed25519 signatures, so the trail verifies alike. 0 when it is not installed."""
    from orchestrator.trail import signing

    try:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    except ImportError:
        return 0.0
    path = signing.anchor_dir() / signing.PRIVATE_NAME
    ours = signing.signing_key()
    signing._PRIVATE[path] = Ed25519PrivateKey.from_private_bytes(path.read_bytes())
    try:
        return measure()
    finally:
        signing._PRIVATE[path] = ours


def append_ratios(tmp: Path, *, rounds: int, n: int) -> dict[str, float]:
    """Events/s of the bare floor, the engine, its syscalls alone and the two syncs before, and each one's
    median ratio to the floor.

    ``rounds`` rounds of ``n`` events each; the order turns round each time, so that a disk that gets busier
    or quieter during the run hits all alike.
    """
    rates: dict[str, list[float]] = {"bare": [], "engine": [], "openssl": [], "one_sync": [], "two_syncs": []}
    cpu: list[tuple[float, float]] = []
    runs = {"bare": lambda i: bare_fsync_rate(tmp / f"bare-{i}.jsonl", n),
            "engine": lambda i: make_run(tmp / f"single-{i}", n, cpu=cpu)[1],
            "openssl": lambda i: signed_through_openssl(lambda: make_run(tmp / f"openssl-{i}", n)[1]),
            "one_sync": lambda i: syncs_rate(tmp, n, head_synced=False),
            "two_syncs": lambda i: syncs_rate(tmp, n, head_synced=True)}
    for index in range(rounds):
        for name in (list(runs) if index % 2 == 0 else list(runs)[::-1]):
            rates[name].append(runs[name](index))
    result = {name: statistics.median(values) for name, values in rates.items()}
    for name in ("engine", "openssl", "one_sync", "two_syncs"):
        result[f"{name}_ratio"] = statistics.median(r / b for r, b in zip(rates[name], rates["bare"]))
    result["engine_user_us"] = statistics.median(u for u, _ in cpu) * 1e6
    result["engine_system_us"] = statistics.median(s for _, s in cpu) * 1e6
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=7, help="side-by-side rounds of the append measurement")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        os.environ["ORCHESTRATOR_ANCHOR_DIR"] = str(Path(tmp) / "anchors")  # every write signs its head there
        appended = append_ratios(Path(tmp), rounds=args.rounds, n=500)
        _, grouped = make_run(state / "grouped", 20_000, batch=20)
        run_id, _ = make_run(state, args.events, batch=1000)
        py = [sys.executable, "-c", "pass"]
        status = [sys.executable, "-m", "orchestrator.cli", "status", run_id, "--json", "--state-dir", str(state)]
        via_click = [sys.executable, "-c", "import sys; from orchestrator.cli import main; main()", *status[3:]]
        audit = [sys.executable, "-m", "orchestrator.cli", "audit", run_id, "--state-dir", str(state)]
        base, stat, click = [], [], []
        for _ in range(args.repeat):  # interleaved so drift hits all alike
            base += wall(py, repeat=1)
            stat += wall(status, repeat=1)
            click += wall(via_click, repeat=1)
        audit_s = statistics.median(wall(audit, repeat=3))
        signed_by = subprocess.run(audit, capture_output=True, text=True, cwd=ROOT).stdout.strip()
        audit_schema_s = statistics.median(wall(audit + ["--schema"], repeat=1))
    b, s, c = statistics.median(base), statistics.median(stat), statistics.median(click)
    print(f"status --json: {s * 1000:.0f} ms vs python -c pass {b * 1000:.0f} ms -> {s / b:.2f}x (goal <= 2x); "
          f"the same through click: {c * 1000:.0f} ms -> {c / b:.2f}x")
    print(f"append, one signed write per event: {appended['engine']:,.0f} events/s; bare fsync'd JSONL on this disk: "
          f"{appended['bare']:,.0f}/s -> {appended['engine_ratio']:.2f} of the floor (median of {args.rounds} rounds "
          f"side by side; goal >= 0.5)\n  its syscalls alone (head pwritten in place, line + fsync; no signing, no "
          f"code): {appended['one_sync']:,.0f}/s -> {appended['one_sync_ratio']:.2f} of the floor; the design before "
          f"(head + fdatasync, then line + fsync): {appended['two_syncs']:,.0f}/s -> "
          f"{appended['two_syncs_ratio']:.2f}\n  CPU per signed write of one event: user "
          f"{appended['engine_user_us']:.0f} us (our code and the signing, the caller's model included), system "
          f"{appended['engine_system_us']:.0f} us\n  the same writes signed through OpenSSL (`cryptography`, "
          f"the signer before libsodium): {appended['openssl']:,.0f}/s -> {appended['openssl_ratio']:.2f} of the floor")
    print(f"append, group commit of 20 events per fsync: {grouped:,.0f} events/s")
    print(f"audit of {args.events:,} events: {audit_s:.2f} s (goal <= 2 s); "
          f"with --schema (pydantic per event): {audit_schema_s:.2f} s\n  {signed_by}")


if __name__ == "__main__":
    main()
