"""The contract between the engine and a workflow's phases.

A phase is a module with ``run(ctx: PhaseContext) -> PhaseResult`` (and optionally
``reconcile(ctx) -> PhaseResult`` for a restart after a crash). The engine owns the
trail: a phase never opens ``events.jsonl``; it reports through the context, whose
methods append events at once (so nothing is lost if the process dies mid-phase).

Heavy work (torch, torchtitan, transformers) never runs in the engine process: a phase
hands it to ``ctx.call(WORKER, request)``, which runs the worker's function in a subprocess
of the target's Python with the target checkout first on ``sys.path`` and returns its answer.
A ``Worker`` handle names the function and its request and answer models once (in a torch-free
``workers.py`` per workflow); both sides of the process boundary validate against them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, Mapping, Protocol, TypeVar

M = TypeVar("M")
Req = TypeVar("Req")
Ans = TypeVar("Ans")

Outcome = Literal["passed", "needs_agent", "needs_human", "waiting_job", "failed"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Issue:
    """Something the agent (or a human) must fix before the phase can pass.

    Attributes:
        code: stable snake_case id, e.g. "router_bias_key_unmapped".
        message: what is wrong, naming the culprit.
        fix_location: where the skill says the fix goes, e.g. "state_dict_adapter.py".
    """

    code: str
    message: str
    fix_location: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class Question:
    """A pause point. ``human_only`` questions cannot be answered through agent tools.

    Attributes:
        key: answer key, e.g. "branch".
        prompt: the question as a person reads it.
        choices: allowed answers, or None for free text / ``schema``.
        schema: optional JSON Schema the answer must satisfy (string answers are parsed
            as JSON first when the schema is not of type string).
        human_only: True when only a human may answer (branch, commit, core change, PRs).
    """

    key: str
    prompt: str
    choices: tuple[str, ...] | None = None
    schema: dict[str, Any] | None = None
    human_only: bool = True


@dataclass(frozen=True, slots=True)
class Worker(Generic[Req, Ans]):
    """A worker function declared once: where it lives and what crosses the process boundary.

    Attributes:
        ref: "pkg.module:function", imported in the worker process (torch may load there).
        request: pydantic model of its request; ``ctx.call`` validates the request into it, and
            the worker process validates it again before calling ``ref`` with the model.
        answer: pydantic model of its answer; the worker process validates the answer before
            writing it, and ``ctx.call`` returns it validated into this model.
    """

    ref: str
    request: type[Req]
    answer: type[Ans]

    @property
    def label(self) -> str:
        """The function's name, e.g. "compare_dtypes" (the default label of a call)."""
        return self.ref.rpartition(":")[2]

    def models(self) -> tuple[str, str]:
        """ "module:Class" of the request and answer models, as the worker process imports them."""
        return (f"{self.request.__module__}:{self.request.__qualname__}",
                f"{self.answer.__module__}:{self.answer.__qualname__}")


@dataclass(frozen=True, kw_only=True)
class PhaseResult:
    """What a phase reports back. The engine turns it into events and a transition.

    Attributes:
        outcome: passed (take ``route``), needs_agent (exit 4), needs_human (exit 3,
            ``questions`` required), waiting_job (exit 5: cluster jobs recorded with
            ``orchestrator.jobs`` run; the engine polls them and re-runs the phase when
            they end), failed (exit 1).
        summary: one line for ``status``.
        data: JSON-able findings, kept in the trail and visible to later phases as
            ``ctx.results[phase]``.
        issues: what must be fixed (needs_agent / failed).
        questions: what a human (or agent) must answer (needs_human / needs_agent).
        route: which declared edge to follow when passed ("next" = the next phase).
    """

    outcome: Outcome
    summary: str
    data: dict[str, Any] = field(default_factory=dict)
    issues: tuple[Issue, ...] = ()
    questions: tuple[Question, ...] = ()
    route: str = "next"


@dataclass(frozen=True, kw_only=True)
class HandBack:
    """Results of a phase's work run elsewhere, read by the phase's ``results`` hook.

    ``orchestrator resume RUN --results DIR`` calls the hook of the phase the run waits in
    as ``hook(snapshot, DIR) -> HandBack`` (raising ``UsageError`` for a DIR it cannot use,
    so nothing is written), then records everything as the human's, then advances.

    Attributes:
        summary: one line for the trail, e.g. "3 rows from /scratch/job-17".
        artifacts: artifact name -> content (the logs as handed back).
        records: (kind, record) pairs to append, which the phase reads on its next attempt.
        answers: pending question key -> answer the hand-back settles.
    """

    summary: str
    artifacts: dict[str, bytes | str] = field(default_factory=dict)
    records: tuple[tuple[str, dict[str, Any]], ...] = ()
    answers: dict[str, str] = field(default_factory=dict)


class PhaseContext(Protocol):
    """What a phase may read and do. Implemented by the engine."""

    run_id: str
    workflow: str
    phase: str
    target: Path
    """Absolute path of the target repository (a git checkout)."""
    options: dict[str, Any]
    """Validated start options of the workflow."""
    answers: dict[str, Any]
    """Answers given so far, by question key."""
    results: dict[str, dict[str, Any]]
    """``data`` of the latest completed attempt of each earlier phase."""
    base: dict[str, Any]
    """Target state recorded at start: {"commit", "branch", "status"}."""
    attempt: int
    """1 for the first try of this phase in this run, then 2, 3, ..."""
    interrupted: bool
    """True when the previous attempt of this phase died before completing."""
    artifacts_dir: Path
    scratch_dir: Path
    """``<state>/scratch/<run_id>/``: room for files outside the trail (worktrees, big temporaries)."""

    def result(self, phase: str, model: type[M] | None = None) -> M:
        """``results[phase]`` read back as ``model``, by default the ``returns`` model the table declares.

        Raises:
            KeyError: ``phase`` has not completed in this run.
            UsageError: no ``model`` given and the table declares none for ``phase``.
        """

    def records(self, model: type[M]) -> list[M]:
        """Every record of the kind the table declares for ``model`` (``Workflow.records``), oldest first.

        Raises:
            UsageError: the table declares no record kind of ``model``.
        """

    def write_artifact(self, name: str, content: str | bytes) -> str:
        """Write ``artifacts/<name>`` atomically and record it with its sha256; returns name."""

    def record_measurement(
        self,
        *,
        name: str,
        unit: str,
        samples: list[float],
        provenance: dict[str, Any],
        labels: dict[str, Any] | None = None,
    ) -> None:
        """Record one metric with all raw samples and its provenance (device, versions, ...)."""

    def note(self, text: str, *, kind: str = "devlog") -> None:
        """Append a timestamped note (devlog entry, decision, dead end)."""

    def notes(self) -> list[dict[str, Any]]:
        """Every note of the run so far, oldest first: {"seq", "ts", "phase", "actor", "kind", "text"}."""

    def events(self, *types: str) -> list[dict[str, Any]]:
        """Every event of the run so far (only those of ``types`` when given), oldest first, as logged.

        For a phase whose text cites the trail: the seq of the event that recorded each number it states.
        """

    def progress(self, message: str) -> None:
        """Show progress (the CLI's stderr, MCP progress notifications) with where the phase stands; never
        recorded."""

    def plan(self, steps: int) -> None:
        """Say how many steps (worker calls, ``call``) this attempt will make, as soon as the phase knows: every
        progress line then says "step k of n" with the time left. A phase that makes more calls than planned
        counts them on; one that stops early just ends. Undeclared, lines say the total is not known."""

    def step(self, message: str) -> Any:
        """A context manager around a planned step that is no worker call (e.g. a torchrun row): its progress
        line, and the step counted as done when the block ends."""

    def call(self, worker: Worker[Any, Ans], request: Any | Mapping[str, Any], *,
             timeout_s: float | None = None, label: str = "") -> Ans:
        """Run ``worker`` in a worker process; stdout/stderr become an artifact.

        Args:
            worker: the handle (function, request model, answer model).
            request: an instance of ``worker.request`` or a mapping it validates.

        Returns:
            The answer, validated into ``worker.answer``.

        Raises:
            WorkerFailed: the worker exited non-zero, timed out, wrote no answer, or one its
                answer model refuses.
        """

    def render(self, template: str, **values: Any) -> str:
        """Render a jinja2 template shipped with the workflow (StrictUndefined)."""

    def record(self, event_type: str, **data: Any) -> None:
        """Append a typed event of ``orchestrator.trail.events`` by its type name (e.g. "patch_applied")."""

    def add_record(self, kind: str, record: dict[str, Any] | Any) -> None:
        """Append a workflow-specific record (e.g. kind "gap_row"); the snapshot lists them by kind.

        A kind the table types (``Workflow.records``) is validated first (a model instance is dumped).

        Raises:
            RecordInvalid: the record is not the table's model of ``kind``.
        """

    @property
    def state(self) -> dict[str, Any]:
        """The live snapshot (records, open patches, artifacts); read-only by convention."""

    last_worker_log: str | None
    """Artifact name of the most recent worker log of this phase attempt."""
