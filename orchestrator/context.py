"""The engine's implementation of ``phase_api.PhaseContext``.

Every method that reports something appends an event at once (fsynced), so a phase that
dies halfway leaves its measurements, artifacts and worker logs in the trail.
"""

from __future__ import annotations

import contextlib
import math
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, TypeVar

from pydantic import BaseModel, ValidationError

from orchestrator.trail import events as ev
from orchestrator.trail.writer import OpenRun
from orchestrator.templates_dir import templates_dir
from orchestrator.errors import RecordInvalid, WorkerFailed
from orchestrator.phase_api import Worker
from orchestrator.progress import Line, Steps
from orchestrator.worker import FRESH, Runner, failure, run_worker

M = TypeVar("M", bound=BaseModel)
A = TypeVar("A", bound=BaseModel)


def json_safe(value: Any) -> Any:
    """Replace NaN/inf (which canonical JSON refuses) with their names as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


class EngineContext:
    """A phase's view of its run; built by the engine for one attempt of one phase."""

    def __init__(
        self,
        run: OpenRun,
        *,
        phase: str,
        templates: str,
        timeout_s: float,
        on_progress: Callable[[Any], None],
        actor: str = "engine",
        runner: Runner = FRESH,
        table: Any = None,
    ) -> None:
        state = run.state
        self._run = run
        self._runner = runner
        self._table = table
        self._templates = templates
        self._timeout_s = timeout_s
        self._on_progress = on_progress
        self._steps = Steps()
        self._actor = actor
        self.run_id = run.run_id
        self.workflow = state["workflow"]
        self.phase = phase
        self.target = Path(state["target"])
        self.options = dict(state["options"])
        self.answers = dict(state["answers"])
        self.results = {k: dict(v) for k, v in state["results"].items()}
        self.base = dict(state["base"])
        self.attempt = state["attempts"].get(phase, 0)
        self.interrupted = False
        self.artifacts_dir = run.dir / "artifacts"
        self.scratch_dir = run.dir.parent.parent / "scratch" / run.run_id
        self.last_worker_log: str | None = None

    @property
    def state(self) -> dict[str, Any]:
        """The live snapshot (read-only by convention): records, open patches, ..."""
        return self._run.state

    def result(self, phase: str, model: type[M] | None = None) -> M:
        """See ``PhaseContext.result``; ``model`` defaults to the phase's ``returns`` in the table."""
        return (model or self._workflow_table().returns(phase)).model_validate(self.results[phase])

    def records(self, model: type[M]) -> list[M]:
        """See ``PhaseContext.records``."""
        return self._workflow_table().records_in(self._run.state, model)

    def _workflow_table(self) -> Any:
        if self._table is None:
            from orchestrator.workflow import load_workflow

            self._table = load_workflow(self.workflow)
        return self._table

    def notes(self) -> list[dict[str, Any]]:
        return [{"seq": e["seq"], "ts": e["ts"], "phase": e["phase"], "actor": e["actor"], **e["data"]}
                for e in self._run.read_events() if e["type"] == "note_added"]

    def events(self, *types: str) -> list[dict[str, Any]]:
        return [e for e in self._run.read_events() if not types or e["type"] in types]

    @property
    def actor(self) -> str:
        """Who this context acts for: "engine", "human" or "agent"."""
        return self._actor

    def _append(self, data: Any) -> dict[str, Any]:
        return self._run.append(data, actor=self._actor, phase=self.phase)

    def write_artifact(self, name: str, content: str | bytes) -> str:
        name, sha, size = self._run.write_artifact_file(name, content)
        self._append(ev.ArtifactWritten(name=name, sha256=sha, bytes=size))
        return name

    def record_measurement(self, *, name: str, unit: str, samples: list[float],
                           provenance: dict[str, Any], labels: dict[str, Any] | None = None) -> None:
        self._append(ev.MeasurementRecorded(
            name=name, unit=unit, samples=[float(s) for s in samples if _finite(s)],
            labels=json_safe(labels or {}), provenance=json_safe(provenance)))

    def note(self, text: str, *, kind: str = "devlog") -> None:
        self._append(ev.NoteAdded(kind=kind, text=text))

    def record(self, event_type: str, **data: Any) -> None:
        """Append a typed event by its type name (e.g. "record_added", "patch_applied")."""
        self._append(ev.DATA_TYPES[event_type](**json_safe(data)))

    def add_record(self, kind: str, record: dict[str, Any] | BaseModel) -> None:
        """See ``PhaseContext.add_record``: a kind the table types is validated before it is appended."""
        if isinstance(record, BaseModel):
            record = record.model_dump(mode="json")
        model = self._table.records.get(kind) if self._table is not None else None
        if model is not None:
            try:
                model.model_validate(record)
            except ValidationError as exc:
                raise RecordInvalid(f"{self.phase}: a {kind!r} record is not a {model.__name__} (records= in the "
                                    f"table): {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}") from None
        self._append(ev.RecordAdded(kind=kind, record=json_safe(record)))

    def progress(self, message: str, within: Line | None = None) -> None:
        """See ``PhaseContext.progress``; ``within``: the worker line it passes on (its loop's step)."""
        self._on_progress(self._steps.update(self.phase, message, within))

    def plan(self, steps: int) -> None:
        """See ``PhaseContext.plan``."""
        self._steps.plan(steps)

    @contextlib.contextmanager
    def step(self, message: str) -> Iterator[None]:
        """See ``PhaseContext.step``."""
        self._steps.start_one()
        self.progress(message)
        try:
            yield
        finally:
            self._steps.finish_one()

    def call(self, worker: Worker[Any, A], request: BaseModel | Mapping[str, Any], *,
             timeout_s: float | None = None, label: str = "") -> A:
        """See ``PhaseContext.call``: the request and the answer are validated by the handle's models."""
        body = worker.request.model_validate(request).model_dump(mode="json")
        answer = self._run_worker(worker.ref, body, models=worker.models(), timeout_s=timeout_s,
                                  label=label or worker.label)
        try:
            return worker.answer.model_validate(answer)
        except ValidationError as exc:
            raise WorkerFailed(f"worker {worker.ref} answered what {worker.answer.__name__} refuses: {exc}; "
                               f"log: artifacts/{self.last_worker_log}", log=self.last_worker_log or "",
                               status="failed") from None

    def _run_worker(self, func: str, request: dict[str, Any], *, models: tuple[str, ...],
                    timeout_s: float | None, label: str) -> dict[str, Any]:
        """Run one call on this context's runner, keep its log as an artifact, record how it ended."""
        self._steps.start_one()
        self.progress(f"worker {label} started")
        try:
            result = run_worker(func, request, target=self.target, python=self.options.get("python") or sys.executable,
                                timeout_s=timeout_s or self._timeout_s, models=models, runner=self._runner,
                                on_progress=lambda line: self.progress(line.message, line))
        finally:
            self._steps.finish_one()
        seq = self._run.state["last_seq"] + 1
        log_name = self.write_artifact(f"logs/{seq:06d}-{self.phase}-{_slug(label)}.log", result.log)
        self.last_worker_log = log_name
        self._append(ev.WorkerFinished(func=func, label=label, status=result.status,
                                       returncode=result.returncode, seconds=round(result.seconds, 3),
                                       log=log_name))
        if result.answer is None:
            raise failure(func, result, log_name=log_name)
        return result.answer

    def render(self, template: str, **values: Any) -> str:
        return render_template(self._templates, template, **values)


def phase_context(run: OpenRun, workflow: Any, *, phase: str | None = None, actor: str = "engine",
                  progress: Callable[[Any], None] = lambda _m: None, runner: Runner = FRESH) -> EngineContext:
    """The engine's one way to build a context: for ``phase`` of ``workflow`` (default: where the run is).

    Args:
        workflow: the run's ``orchestrator.workflow.Workflow`` (templates, the phase's worker timeout).
        actor: who acts through it: "engine" for a phase, the submitter for a submission or hand-back.
        runner: which process runs its worker calls.
    """
    name = phase or run.state["phase"]
    spec = next((p for p in workflow.phases if p.name == name), None)
    return EngineContext(run, phase=name, templates=workflow.templates, timeout_s=spec.timeout_s if spec else 0,
                         on_progress=progress, actor=actor, runner=runner, table=workflow)


def render_template(folder: str, template: str, **values: Any) -> str:
    """Render ``templates/<folder>/<template>`` with StrictUndefined."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates_dir(folder)),
        undefined=jinja2.StrictUndefined,
        # NOTE: reports and commit messages end with a newline; jinja drops it by default.
        keep_trailing_newline=True,
        autoescape=False,
    )
    return env.get_template(template).render(**values)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in text)[:60]
