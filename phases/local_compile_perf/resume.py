"""Worker answers of an attempt that was cut, read back when its phase reruns on the same machine.

A device call ends at its limit wherever the run stands, and the engine reruns a phase that started and never
completed from its start. The worker calls of the cut attempt that had finished (the trap checks, a graph
count, a TP/EP build check, a screen) need not run again: ``call_kept`` keeps each answer in the run's scratch
dir, keyed by the worker and its request and by the machine (boot and GPU), and a rerun after an interruption
(``ctx.interrupted``) reads it back instead of calling, which the devlog says. The cut attempt's worker call
and log are in the trail already. A confirmation keeps each fresh process instead (``confirmed.call_confirm``).
Engine side: no torch.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, TypeVar

from orchestrator.phase_api import PhaseContext, Worker
from phases.local_compile_perf.devlog import log

A = TypeVar("A")


def kept_path(ctx: PhaseContext, label: str, suffix: str) -> Path:
    """``<scratch>/journal/<phase>-<label><suffix>``: where one call of this phase keeps what it finished."""
    slug = "".join(c if c.isalnum() else "-" for c in label)
    path = ctx.scratch_dir / "journal" / f"{ctx.phase}-{slug}{suffix}"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def call_kept(ctx: PhaseContext, worker: Worker[Any, A], request: Any, *, label: str) -> A:
    """``ctx.call(worker, request, label=label)``, or its answer from the attempt that was cut (see the module)."""
    from phases.kit.confirm import machine_id

    body = worker.request.model_validate(request).model_dump(mode="json")
    key = hashlib.sha256(json.dumps({"func": worker.ref, "request": body}, sort_keys=True).encode()).hexdigest()
    path, machine = kept_path(ctx, label, ".answer.json"), machine_id()
    if ctx.interrupted and path.is_file():
        saved = json.loads(path.read_text())
        if saved.get("key") == key and saved.get("machine") == machine:
            log(ctx, f"{label}: the answer of the attempt that was cut is read back (same request, this machine: "
                     f"{machine}), not computed again", kind="measurement")
            return worker.answer.model_validate(saved["answer"])
    answer = ctx.call(worker, request, label=label)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps({"key": key, "machine": machine,
                                   "answer": worker.answer.model_validate(answer).model_dump(mode="json")}))
    os.replace(partial, path)
    return answer
