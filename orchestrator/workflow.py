"""Workflows as data: an ordered table of phases with named gates and declared edges.

A ``Workflow`` is checked when it is built (import time): every phase module is
imported and must expose ``run``; every gate name must be known; every route must lead
to a phase or to "done"; every phase must be reachable. All problems are reported at
once in one ``WorkflowDefinitionError``. The engine turns the table into a
``transitions.Machine`` per run; this module only describes it.

Edges of a phase: each entry of ``routes`` (label -> dest, "next" by default) is taken
when the phase passes; "needs agent", "needs human" and "failed" keep the run in the
phase (a later ``advance``/``resume`` runs it again).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Mapping, TypeVar

from orchestrator.errors import UsageError, WorkflowDefinitionError

if TYPE_CHECKING:  # the class is only named in annotations; importing pydantic costs ~0.1 s
    from pydantic import BaseModel

M = TypeVar("M", bound="BaseModel")
DONE = "done"
Gate = Callable[[dict[str, Any]], list[str]]
"""Takes the run snapshot; returns the reasons the phase may not be entered (empty = open)."""
Rule = Callable[[list[dict[str, Any]], dict[str, Any]], list[tuple[int, str]]]
"""Audit rule: takes (events, snapshot); returns (seq, message) violations."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Violation:
    """A guard's finding: the run may not advance while it holds."""

    message: str
    paths: tuple[str, ...] = ()


Guard = Callable[[dict[str, Any]], Violation | None]
"""Runs at every advance with the snapshot (target, base, options); None = fine."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Prepared:
    """What a workflow's ``prepare`` hands the engine before a run exists.

    Attributes:
        target: absolute path of the git checkout the run works on.
        options: the options to record (normalized, e.g. resolved paths).
        answers: questions already answered on the command line (key -> value).
    """

    target: str
    options: dict[str, Any]
    answers: dict[str, Any] = field(default_factory=dict)


Prepare = Callable[..., Prepared]
"""``prepare(options_model, state_dir, *, runner)``: validate input, make the workspace; raise UsageError.
``runner`` (an ``orchestrator.worker.Runner``) runs any worker call it makes, as the run's phases will."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Submission:
    """A row of the table for input a run takes from outside (``orchestrator submit``, agent tool ``submit``).

    Attributes:
        phase: the phase that accepts it; the run must be waiting there.
        args: its pydantic argument model (the CLI's ``--field value`` pairs and the tool's
            ``args`` are validated against it; its JSON schema is what ``explain`` shows).
        check: "module:function" called as ``fn(ctx, args, tool_call_id)`` under the run's lock,
            with ``ctx`` an engine context of ``phase``: it refuses (UsageError, nothing recorded
            unless it records the refusal itself), else acts and records.
        drive: advance the run once the submission is recorded (False: the run stays where it is).
        noun: what the row is called in messages, e.g. "candidates".
    """

    phase: str
    args: type[BaseModel]
    check: str
    drive: bool = True
    noun: str = ""


PATCH = "patch"
"""The engine's own submission kind: a temporary patch of the ledger (``orchestrator.ledger.patch_row``);
a workflow takes temporary patches exactly when its table has this row."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PhaseSpec:
    """One row of the workflow table.

    Attributes:
        name: state name, e.g. "probe".
        module: dotted module with ``run(ctx) -> PhaseResult`` (and optional ``reconcile``).
        title: one line for ``graph`` and ``status``.
        gates: gate names that must be open to enter this phase.
        routes: extra edges taken on "passed": label -> dest phase (or "done").
        timeout_s: wall-clock budget for one worker call of this phase.
        allowed_paths: path prefixes (relative to the target) an agent may edit while the
            run waits in this phase; empty means no edits at all.
        agent_notes: the skill's rules for this phase, written for an agent to read.
        results: "module:function" that turns a directory of results run elsewhere into a
            ``phase_api.HandBack`` (``orchestrator resume RUN --results DIR``); "" = none taken.
        returns: pydantic model of the phase's ``data`` when it passes (None: undeclared). The
            engine validates the data when the phase returns it (a mismatch fails the phase),
            and ``ctx.result(name)`` reads it back as this model.
        asks: ``phase_api.Question``s the phase asks whatever it finds, unless already answered
            (e.g. the skill's pre-flight questions). Being known before the phase runs, the engine
            asks them as soon as the run reaches the phase (at start, for the first phase), so a
            person can answer them with ``resume --answer`` before any advance.
    """

    name: str
    module: str
    title: str = ""
    gates: tuple[str, ...] = ()
    routes: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 1800.0
    allowed_paths: tuple[str, ...] = ()
    agent_notes: str = ""
    results: str = ""
    returns: type[BaseModel] | None = None
    asks: tuple[Any, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Workflow:
    """A skill as a table; see the module docstring."""

    name: str
    description: str
    phases: tuple[PhaseSpec, ...]
    options: type[BaseModel]
    prepare: Prepare
    gates: Mapping[str, Gate] = field(default_factory=dict)
    guards: Mapping[str, Guard] = field(default_factory=dict)
    rules: Mapping[str, Rule] = field(default_factory=dict)
    scope: tuple[str, ...] = ()
    """Path prefixes the run may change permanently; a temporary patch may not touch them."""
    frozen: tuple[str, ...] = ()
    """Paths (prefixes) no agent tool may edit; the workflow's guards re-check them from git."""
    submissions: Mapping[str, Submission] = field(default_factory=dict)
    """Input taken from outside, by kind (e.g. "candidate", "patch"); see ``Submission``."""
    human_options: tuple[str, ...] = ()
    """Start options only a person may give: they answer human-only questions (agents' starts refuse them)."""
    templates: str = ""
    """The workflow's folder under the top-level ``templates/`` (see ``orchestrator.templates_dir``)."""
    records: Mapping[str, type[BaseModel]] = field(default_factory=dict)
    """Record kinds the run's phases add (``ctx.add_record``), kind -> pydantic model: validated when
    added, read back typed by ``ctx.records(Model)``, checked by ``audit --schema``. Undeclared kinds
    are taken as they are."""
    after_phase: tuple[Callable[[Any], None], ...] = ()
    """Hooks the engine calls with the phase's context when any phase's ``run`` (or ``reconcile``) ends,
    also when it raised, e.g. rendering a devlog from the notes: cross-cutting, so declared once here."""
    modules: dict[str, ModuleType] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        problems = self._check_table() + self._load_modules()
        if problems:
            raise WorkflowDefinitionError(
                f"workflow {self.name} has {len(problems)} problem(s): " + "; ".join(problems)
            )

    @property
    def initial(self) -> str:
        return self.phases[0].name

    def phase(self, name: str) -> PhaseSpec:
        return next(p for p in self.phases if p.name == name)

    def edges(self, spec: PhaseSpec) -> dict[str, str]:
        """Every route of a phase, with "next" defaulting to the following row (or done)."""
        index = self.phases.index(spec)
        following = self.phases[index + 1].name if index + 1 < len(self.phases) else DONE
        return {"next": following, **dict(spec.routes)}

    def _check_table(self) -> list[str]:
        problems: list[str] = []
        if not self.phases:
            return ["no phases"]
        names = [p.name for p in self.phases]
        problems += [f"phase {n!r} declared twice" for n in sorted({n for n in names if names.count(n) > 1})]
        if DONE in names:
            problems.append(f"{DONE!r} is reserved for the final state")
        for spec in self.phases:
            problems += [f"phase {spec.name!r}: gate {g!r} unknown" for g in spec.gates if g not in self.gates]
            for label, dest in spec.routes.items():
                if dest not in names and dest != DONE:
                    problems.append(f"phase {spec.name!r}: route {label!r} leads to unknown phase {dest!r}")
        reachable = self._reachable()
        problems += [f"phase {n!r} unreachable" for n in names if n not in reachable]
        fields = getattr(self.options, "model_fields", {})
        problems += [f"human option {o!r} is not an option" for o in self.human_options if o not in fields]
        problems += [f"after_phase hook {h!r} is not callable" for h in self.after_phase if not callable(h)]
        problems += [f"phase {p.name!r}: returns {p.returns!r} is not a pydantic model" for p in self.phases
                     if p.returns is not None and not _is_model(p.returns)]
        problems += [f"record kind {k!r}: {m!r} is not a pydantic model" for k, m in self.records.items()
                     if not _is_model(m)]
        kinds = {}
        for kind, model in self.records.items():
            kinds.setdefault(model, []).append(kind)
        problems += [f"record kinds {', '.join(map(repr, k))} share {m.__name__} (ctx.records(Model) needs one kind)"
                     for m, k in kinds.items() if len(k) > 1]
        for kind, row in self.submissions.items():
            if row.phase not in names:
                problems.append(f"submission {kind!r}: phase {row.phase!r} unknown")
            if not callable(resolve_ref(row.check, problems)):
                problems.append(f"submission {kind!r}: check {row.check!r} is not a function")
        return problems

    def _reachable(self) -> set[str]:
        seen, todo = set(), [self.phases[0].name]
        known = {p.name for p in self.phases}
        while todo:
            name = todo.pop()
            if name in seen or name not in known:
                continue
            seen.add(name)
            todo.extend(self.edges(self.phase(name)).values())
        return seen

    def _load_modules(self) -> list[str]:
        problems = []
        for spec in self.phases:
            try:
                module = importlib.import_module(spec.module)
            except ImportError as exc:
                problems.append(f"phase {spec.name!r}: cannot import {spec.module} ({exc})")
                continue
            if not callable(getattr(module, "run", None)):
                problems.append(f"phase {spec.name!r}: {spec.module} has no run(ctx)")
            self.modules[spec.name] = module
            if spec.results and not callable(resolve_ref(spec.results, problems)):
                problems.append(f"phase {spec.name!r}: results hook {spec.results!r} is not a function")
        return problems

    def returns(self, phase: str) -> type[BaseModel]:
        """The declared result model of ``phase``; UsageError naming the table when there is none."""
        spec = next((p for p in self.phases if p.name == phase), None)
        if spec is None or spec.returns is None:
            what = "has no phase" if spec is None else "declares no returns= for phase"
            raise UsageError(f"workflow {self.name} {what} {phase!r}; pass the model (ctx.result(phase, Model)) "
                             "or declare it in the table")
        return spec.returns

    def result_in(self, state: Mapping[str, Any], phase: str) -> Any:
        """``state``'s result of ``phase`` as its ``returns`` model; None when the phase has left none yet.

        For code that holds a snapshot rather than a context (gates, hand-back hooks, the survey); the
        snapshot keeps the data of a phase's latest pass or wait, so a model must accept both.
        """
        data = state["results"].get(phase)
        return None if data is None else self.returns(phase).model_validate(data)

    def records_in(self, state: Mapping[str, Any], model: type[M]) -> list[M]:
        """``state``'s records of the kind the table declares for ``model``, oldest first (see ``records``)."""
        return [model.model_validate(r) for r in state["records"].get(self.record_kind(model), [])]

    def check_result(self, name: str, result: Any) -> Any:
        """``result`` of phase ``name``, or a failed one when its passing data is not its ``returns`` model."""
        import dataclasses

        from pydantic import ValidationError

        model = self.phase(name).returns
        if model is None or result.outcome != "passed":
            return result
        try:
            model.model_validate(result.data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "data"
            message = (f"{name}: its result is not a {model.__name__} (returns= in the {self.name} table): "
                       f"{where}: {first['msg']}")
            return dataclasses.replace(result, outcome="failed", summary=message, route="next",
                                       data={"error": message, "code": "result_invalid"})
        return result

    def record_kind(self, model: type[BaseModel]) -> str:
        """The record kind whose declared model is ``model``; UsageError when the table declares none."""
        kind = next((k for k, m in self.records.items() if m is model), None)
        if kind is None:
            raise UsageError(f"workflow {self.name} declares no record kind of {model.__name__} (Workflow.records)")
        return kind

    def mermaid(self) -> str:
        """The table as a mermaid flowchart: solid edges on pass, dotted self-loops for waits."""
        lines = ["flowchart TD"]
        for spec in self.phases:
            label = spec.title or spec.name
            gates = f"<br/>gates: {', '.join(spec.gates)}" if spec.gates else ""
            lines.append(f'  {spec.name}["{spec.name}: {label}{gates}"]')
        lines.append(f"  {DONE}([done])")
        for spec in self.phases:
            for label, dest in self.edges(spec).items():
                lines.append(f"  {spec.name} -->|{label}| {dest}")
            lines.append(f"  {spec.name} -.->|needs agent / human / failed| {spec.name}")
        return "\n".join(lines) + "\n"


def _is_model(value: Any) -> bool:
    return isinstance(value, type) and callable(getattr(value, "model_validate", None))


def resolve_ref(ref: str, problems: list[str] | None = None) -> Any:
    """The object named by "module:attr" (None, with a problem noted, if it cannot be imported)."""
    module_name, _, attr = ref.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr, None)
    except ImportError as exc:
        if problems is not None:
            problems.append(f"cannot import {module_name} ({exc})")
        return None


BUILTIN_WORKFLOWS = {
    "add-moe-model": "phases.add_moe_model.workflow:WORKFLOW",
    "local-compile-perf": "phases.local_compile_perf.workflow:WORKFLOW",
}
BUILTIN_COMMANDS = ("phases.add_moe_model.survey.cli",)
"""CLI command modules a workflow adds (each has ``register(main, command)``), e.g. ``orchestrator survey``."""


def workflow_refs() -> dict[str, str]:
    """Known workflows: the built-in ones plus ORCHESTRATOR_WORKFLOWS="name=mod:attr,...".

    The environment hook lets tests and users plug in a workflow without editing the engine.
    """
    refs = dict(BUILTIN_WORKFLOWS)
    for item in filter(None, os.environ.get("ORCHESTRATOR_WORKFLOWS", "").split(",")):
        name, _, ref = item.partition("=")
        refs[name.strip()] = ref.strip()
    return refs


def load_workflow(name: str) -> Workflow:
    """Import and return the workflow called ``name``; UsageError if unknown."""
    refs = workflow_refs()
    if name not in refs:
        raise UsageError(f"unknown workflow {name!r}; known: {', '.join(sorted(refs))}")
    module_name, _, attr = refs[name].partition(":")
    try:
        workflow = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError, TypeError) as exc:
        raise UsageError(f"workflow {name!r} = {refs[name]!r} cannot be loaded ({type(exc).__name__}: {exc}); "
                         "fix ORCHESTRATOR_WORKFLOWS (name=module:attribute)") from None
    if not isinstance(workflow, Workflow):
        raise UsageError(f"{refs[name]} is not a Workflow")
    return workflow
