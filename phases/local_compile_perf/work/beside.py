"""Worker calls side by side, each in its own process: for checks that compile and time nothing.

``beside_worker`` starts each of its ``calls`` in a fresh worker process at once
(``orchestrator.worker.run_worker``, the process ``ctx.call`` would start), waits for all, copies each
one's log into its own under a header, and answers each one's answer or how it failed. The graph-budget
phase runs its graph count and the TP/EP build check this way: both are compile-bound (Inductor, on the
host's cores) and measure no time, and one after the other they took 68 + 75 s of a device call (the H200
trail of 2026-12-04). Stdlib and pydantic only here; the calls import torch in their own processes.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict


class BesideCall(BaseModel):
    """One worker call: what ``ctx.call`` would be given."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    label: str
    func: str
    """"pkg.mod:fn" of the worker (e.g. the IN_CHECKOUT wrapper)."""
    models: tuple[str, ...] = ()
    request: dict[str, Any]
    timeout_s: float = 900.0


class BesideRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    calls: tuple[BesideCall, ...]


class BesideResult(BaseModel):
    """How one call ended: its answer, or its status and the end of its log."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    label: str
    answer: dict[str, Any] | None
    status: str
    """ok, failed or timeout (``orchestrator.worker.WorkerRun``)."""
    returncode: int | None
    seconds: float
    error: str = ""
    """The last lines of its log when it gave no answer."""


class BesideAnswer(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    results: tuple[BesideResult, ...]


def beside_worker(request: dict) -> dict:
    """Worker entry: ``BesideRequest`` -> ``BesideAnswer`` (see the module docstring)."""
    from orchestrator.worker import run_worker

    req = BesideRequest.model_validate(request)

    def one(call: BesideCall) -> Any:
        return run_worker(call.func, call.request, target=Path.cwd(), models=call.models, timeout_s=call.timeout_s)

    with ThreadPoolExecutor(max_workers=len(req.calls)) as pool:
        runs = list(pool.map(one, req.calls))
    results = []
    for call, run in zip(req.calls, runs):
        log = run.log.decode("utf-8", "replace")
        print(f"===== {call.label}: {run.status} (exit {run.returncode}) after {run.seconds:.1f} s =====",
              file=sys.stderr)
        sys.stderr.write(log)
        error = "" if run.answer is not None else "\n".join(log.strip().splitlines()[-12:])
        results.append(BesideResult(label=call.label, answer=run.answer, status=run.status,
                                    returncode=run.returncode, seconds=round(run.seconds, 3), error=error))
    return BesideAnswer(results=tuple(results)).model_dump(mode="json")
