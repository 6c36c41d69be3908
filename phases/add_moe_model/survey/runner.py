"""Drive the survey: one warm worker per target, one add-moe-model run per model type.

Each model is started and advanced through the engine like any run (``--branch current
--commit never``), so ``orchestrator audit RUN`` verifies it; the worker calls of every
run are forked from one warm worker that imported torch, transformers and torchtitan once
(``orchestrator.warm_worker``). Rows are written to ``survey.json`` as each model ends and
the run in flight is recorded before it advances, so the same command after Ctrl-C or
kill -9 keeps the finished rows and advances the interrupted run where it stopped.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from orchestrator.errors import RunIsFinished, UsageError
from orchestrator.trail.store import RunStore, atomic_write
from phases.add_moe_model.survey.outcome import OUTCOMES, UNSUPPORTED_CODES, SurveyRow, row_from_run

WORKFLOW = "add-moe-model"
DISCOVER = "phases.add_moe_model.survey.discover:list_moe_models"
# The worker package first: importing it applies the torch compat layer, as in a fresh worker,
# before any torchtitan module is imported.
PRELOAD = ("phases.add_moe_model.work", "torch", "transformers", "torchtitan",
           "torchtitan.experiments.transformers_modeling_backend.moe_replacement",
           "torchtitan.experiments.transformers_modeling_backend.state_dict_adapter",
           "torchtitan.experiments.transformers_modeling_backend.hf_sharding",
           "phases.add_moe_model.work.numerics", "phases.add_moe_model.work.probe",
           "phases.add_moe_model.work.build_check")
REFUSED_AS_UNSUPPORTED = UNSUPPORTED_CODES | {"hf_config_unavailable", "bad_model_source"}


@dataclass(frozen=True, kw_only=True)
class SurveyOptions:
    models: tuple[str, ...] | None
    """None: every MoE model type that transformers has."""
    target: str
    device: str
    out: Path
    state_dir: Path


@dataclass(frozen=True, kw_only=True)
class Survey:
    rows: list[SurveyRow]
    counts: dict[str, int]
    transformers: str
    seconds: float
    warm_import_s: float | None
    """Seconds the warm worker took to import torch, transformers and torchtitan (None: not started)."""


def run_survey(opts: SurveyOptions, *, say: Callable[[str], None]) -> Survey:
    root = warm_root(opts.target, opts.state_dir)
    store = RunStore(opts.state_dir)
    store.ensure_writable()
    opts.out.mkdir(parents=True, exist_ok=True)
    saved = load_progress(opts.out)
    started = time.monotonic()
    with warm_worker(root, say=say) as warm:
        found = discover(root, runner=warm.runner)
        wanted = list(opts.models) if opts.models else [m["model_type"] for m in found["models"]]
        rows = {r.model_type: r for r in saved["rows"] if r.model_type in wanted}
        todo = [m for m in wanted if m not in rows]
        say(f"{len(wanted)} model types ({len(rows)} already surveyed in {opts.out}); "
            f"transformers {found['transformers']}")
        timings: list[float] = []
        for index, model_type in enumerate(todo, start=1):
            t0 = time.monotonic()
            row = survey_one(model_type, opts, store=store, root=root, in_flight=saved["in_flight"], runner=warm.runner)
            row.seconds = round(time.monotonic() - t0, 1)
            rows[model_type], saved["in_flight"] = row, {}
            save_progress(opts.out, rows, found["transformers"], in_flight={})
            timings.append(row.seconds)
            eta = sum(timings) / len(timings) * (len(todo) - index)
            why = f": {row.reasons[0][:300]}" if row.outcome == "error" and row.reasons else ""
            say(f"[{len(rows)}/{len(wanted)}] {model_type}: {row.outcome} ({row.seconds:.0f} s){why}; "
                f"ETA {int(eta // 60)}m{int(eta % 60):02d}s")
    ordered = [rows[m] for m in wanted]
    counts = {o: sum(r.outcome == o for r in ordered) for o in OUTCOMES}
    return Survey(rows=ordered, counts=counts, transformers=found["transformers"],
                  seconds=round(time.monotonic() - started, 1), warm_import_s=warm.ready_s)


def survey_one(model_type: str, opts: SurveyOptions, *, store: RunStore, root: Path,
               in_flight: dict[str, str], runner: Any = None) -> SurveyRow:
    """Start (or continue) this model's run and classify it; our own exceptions are ``error`` rows."""
    from orchestrator import engine
    from orchestrator.worker import FRESH

    runner = runner or FRESH

    model = f"type:{model_type}"
    run_id = in_flight.get(model_type)
    try:
        if run_id is None:
            target = "embedded" if opts.target == "embedded" else str(clone_target(root, opts.state_dir, model_type))
            options = {"model": model, "target": target, "branch": "current", "commit": "never", "device": opts.device,
                       "torchrun_rows": "skip"}
            try:
                run_id = engine.start(WORKFLOW, options, store=store, runner=runner).run_id
            except UsageError as exc:
                if exc.code in REFUSED_AS_UNSUPPORTED:
                    return SurveyRow(model_type=model_type, model=model, outcome="unsupported", reasons=[exc.message])
                raise
            save_in_flight(opts.out, model_type, run_id)
        try:
            state = engine.advance(run_id, store=store, runner=runner).state
        except RunIsFinished:  # killed after its run ended but before its row was saved
            state = store.read_state(run_id)
        return row_from_run(model_type, model, state, store.run_dir(run_id), warm_root=str(root))
    except Exception as exc:  # noqa: BLE001 - any exception reaching here is ours: an error row
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        where = f"{Path(frame.filename).name}:{frame.lineno}"
        return SurveyRow(model_type=model_type, model=model, outcome="error", run_id=run_id,
                         reasons=[f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} at {where}"])


def warm_root(target: str, state_dir: Path) -> Path:
    """The checkout the warm worker imports from: the pristine embedded repo or the clean PATH checkout."""
    from phases.add_moe_model.start import check_checkout
    from phases.add_moe_model.workspace import pristine_repo

    if target == "embedded":
        return pristine_repo(state_dir)
    root = Path(target).expanduser().resolve()
    check_checkout(root)
    return root


def clone_target(root: Path, state_dir: Path, model_type: str) -> Path:
    """A clone of a PATH target per model: runs never edit the user's checkout or each other's."""
    import git

    clone = state_dir / "workspaces" / f"survey-{model_type}-{secrets.token_hex(3)}"
    git.Repo.clone_from(str(root), str(clone), local=True)
    return clone


class warm_worker:  # noqa: N801 - used as a context manager
    """Start ``orchestrator.warm_worker`` in ``root``; ``runner`` forks worker calls from it until exit
    (``FRESH`` when it did not start)."""

    def __init__(self, root: Path, *, say: Callable[[str], None], preload: tuple[str, ...] = PRELOAD) -> None:
        self.root, self.say, self.preload = root, say, preload

    def __enter__(self) -> "warm_worker":
        from orchestrator.worker import FRESH, Runner, worker_env
        from orchestrator.worker_main import die_with_parent

        self.tmp = tempfile.TemporaryDirectory(prefix="orchestrator-warm-")
        sock = str(Path(self.tmp.name, "sock"))
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.warm_worker", sock, str(self.root), *self.preload],
            cwd=self.root, env=worker_env(self.root), stdout=subprocess.PIPE, preexec_fn=die_with_parent)
        ready = json.loads(self.proc.stdout.readline() or b'{"ready": false}')
        self.ready_s = round(time.monotonic() - t0, 1) if ready.get("ready") else None
        self.runner = FRESH
        if ready.get("ready"):
            self.runner = Runner(warm_socket=sock)
            dropped = (f"; {ready['dropped_for_cuda']} and later modules left to each call: importing it "
                       "initialised CUDA, which a forked call could not use" if ready.get("dropped_for_cuda") else "")
            self.say(f"warm worker ready in {time.monotonic() - t0:.1f} s ({ready['files']} target files "
                     f"imported; not imported: {ready['failed'] or 'none'}{dropped})")
        else:
            self.say("warm worker did not start: every worker call runs in a fresh process")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.proc.kill()
        self.proc.wait()
        self.tmp.cleanup()


def discover(root: Path, *, runner: Any = None) -> dict[str, Any]:
    from orchestrator.worker import FRESH, failure, run_worker

    result = run_worker(DISCOVER, {}, target=root, timeout_s=600, runner=runner or FRESH)
    if result.answer is None:
        raise failure(DISCOVER, result, log_name="(not kept)")
    return result.answer


def load_progress(out: Path) -> dict[str, Any]:
    path = out / "survey.json"
    if not path.is_file():
        return {"rows": [], "in_flight": {}}
    raw = json.loads(path.read_text())
    return {"rows": [SurveyRow.model_validate(r) for r in raw.get("rows", [])], "in_flight": raw.get("in_flight", {})}


def save_progress(out: Path, rows: dict[str, SurveyRow], transformers: str, *, in_flight: dict[str, str]) -> None:
    body = {"transformers": transformers, "rows": [r.model_dump() for r in rows.values()], "in_flight": in_flight}
    atomic_write(out / "survey.json", json.dumps(body, indent=2, sort_keys=True).encode() + b"\n")


def save_in_flight(out: Path, model_type: str, run_id: str) -> None:
    path = out / "survey.json"
    body = json.loads(path.read_text()) if path.is_file() else {"rows": []}
    body["in_flight"] = {model_type: run_id}
    atomic_write(path, json.dumps(body, indent=2, sort_keys=True).encode() + b"\n")
