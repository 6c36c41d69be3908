"""What the later local-compile-perf phases hand on, and the records the checks add: frozen, typed.

Each phase from ideal_times to correctness returns ``data=`` one of these (the table's ``returns=``),
and the checks record each candidate's fate as a ``candidate_verdict``. A check that rejects a
candidate still *passes* (route "rejected", back to pick_fix) with ``{"verdict": ...}`` as its data;
that is why the checks' models hold either their numbers or a verdict.
"""

from __future__ import annotations

from typing import Any, Literal

from phases.kit.records import Bandwidth, Record
from phases.local_compile_perf.records import Candidate, Cell, Judgement


class GlueRow(Record):
    """One glue op of the ideal-times table, per step: per-call medians times calls per step."""

    op: str
    """The op's name in its region, e.g. "rms_norm#1"."""
    region: str
    calls_per_step: int
    shapes: tuple[Any, ...]
    fwd_ms: float
    bwd_ms: float
    measured_ms: float
    ideal_ms: float
    """Bytes moved at the measured copy bandwidth: the floor a rewrite aims at."""
    gap_ms: float
    bytes: int
    eager_bytes: int
    best_known_ms: float | None
    """A best-known kernel's time for the same arguments (None when none was measured)."""
    best_known: str
    """That kernel and its source, or why there is no time (work/best_known.describe)."""
    noise: str = ""
    """Why its samples cannot be read as its cost ("" when they can), e.g. a forward slower than fwd+bwd."""


class IdealTimes(Record):
    """The ideal_times phase's answer."""

    bandwidth: Bandwidth
    tokens: int
    """The token count the glue ops were measured at."""
    rows: tuple[GlueRow, ...]
    regions_found: tuple[str, ...]
    eager_step: dict[str, float] | None = None
    """wall_ms, kernel_ms, glue_ms of the whole eager step, timed in the process that timed the ops alone
    (work/glue EagerStep); None for a harness without regions."""


class RankedOp(Record):
    """One op above the rank phase's cut (or kept under it, ``kept_because`` says why)."""

    op: str
    measured_ms: float
    ideal_ms: float
    gap_ms: float
    share_pct: float
    """measured / layer, in percent."""
    score_ms: float
    """gap x share: the ranking's key."""
    gain_pct: float
    """gap / layer, in percent: the most a fix can save."""
    kept_because: str


class StopRule(Record):
    """The rank phase's stop decision (before any stack entry)."""

    stop: bool
    reason: str
    threshold: float
    """Share of the layer under which a remaining gap or a next gain is not worth a rewrite."""
    caveat: str


class Rank(Record):
    """The rank phase's answer."""

    layer_ms: float
    tokens: int
    ranked: tuple[RankedOp, ...]
    dropped: tuple[str, ...]
    """Ops under the cut."""
    unregioned_ms: float
    """Eager time outside every region (an estimate; its own row in ``ranked`` when positive)."""
    eager_glue_ms: float
    stop: StopRule


class CandidateVerdict(Record):
    """A ``candidate_verdict`` record: a candidate rejected by a check, or validated into the stack."""

    id: str
    branch: str
    label: str
    verdict: Literal["rejected", "validated"]
    phase: str
    """The phase that ruled, e.g. "graph_budget"."""
    reason: str
    numbers: dict[str, Any] = {}
    """The numbers behind the ruling; their keys are the ruling phase's (graph counts, cells, comparisons,
    scope), so they are kept as that phase wrote them."""
    kept_branch: str | None
    """rejected/<name> or the stack branch; None when the candidate's branch could not be replayed."""


class PickFix(Record):
    """pick_fix's data: the candidate it passes on, the finished stack, a rejection, or (waiting) the agent's brief.

    Which fields are set depends on the route: a prepared candidate (next), the stack (finish), a verdict
    (rejected, when the branch cannot be replayed), or, while it waits for the agent, the ranking and
    the stop rule as they stand.
    """

    candidate: Candidate | None = None
    stack: tuple[dict[str, Any], ...] | None = None
    """The ``stack_entry`` records so far."""
    verdict: CandidateVerdict | None = None
    ranked: tuple[RankedOp, ...] | None = None
    stop: StopRule | None = None
    stop_now: dict[str, Any] | None = None
    """stop_state.StopNow.as_data(): the stop rule after the stack's entries."""
    verdicts: tuple[CandidateVerdict, ...] | None = None
    regions_not_enabled: dict[str, str] | None = None
    best_known_offers: tuple[str, ...] | None = None
    waived: dict[str, str] = {}
    """A person's waiver of the wait's finding (``orchestrator.waivers``)."""


class GraphNumbers(Record):
    """A candidate's compiled graphs over every token count and no_grad."""

    per_region: dict[str, int]
    unique_graphs: int
    limit: int
    """Dynamo's recompile limit."""
    target: int
    """Most graphs per region with headroom."""
    limit_hit: str
    """What hit the limit ("" when nothing did)."""
    tokens: tuple[int, ...]
    no_grad: bool
    recompile_reasons: dict[str, str] = {}
    """Per region that recompiled: the last guard that failed (Dynamo's words)."""


class GraphCount(GraphNumbers):
    """A ``graph_count`` record: the numbers, with the candidate they are of."""

    candidate: str
    """The candidate's id."""


class GraphBudget(Record):
    """graph_budget's data: the graphs (passed on) or the rejection."""

    graphs: GraphNumbers | None = None
    tp_ep: dict[str, Any] | None = None
    """The TP/EP build check in brief (tp_ep.brief; the full check is the tp_ep_build_check record)."""
    verdict: CandidateVerdict | None = None


class Ruling(Record):
    ok: bool
    wins: int
    losses: int
    reason: str


class ScreenConfirm(Record):
    """screen_confirm's data: the screen, the fresh-process cells and the judgements, or the rejection."""

    screen_medians_ms: dict[str, float] | None = None
    rows: tuple[Cell, ...] = ()
    judged: tuple[Judgement, ...] = ()
    replay: tuple[Judgement, ...] = ()
    """Judgements of CUDA-graph replay (CUDA only)."""
    ruling: Ruling | None = None
    verdict: CandidateVerdict | None = None


class Comparison(Record):
    """One dtype's outputs and grads against the reference: the worst tensor and whether all are within."""

    label: str
    tolerance: float
    tensors: int
    ok: bool
    worst: str
    worst_rel_l2: float
    failing: tuple[str, ...]


class CorrectnessRecord(Record):
    """The ``correctness`` record of a candidate: its comparisons, and correctness's data when it passes."""

    candidate: str
    tokens: int
    comparisons: tuple[Comparison, ...]
    reference_downcasts: tuple[str, ...]
    """Ops the fp64 reference ran in a lower dtype (empty: a pure fp64 reference)."""
    reference_pure_fp64: bool
    not_covered: dict[str, str]
    # NOTE: the three below are optional only because committed trails (bench/results/2026-11-30-lcp-h200)
    # hold records from before each was written; today's correctness phase always writes them.
    routing_replayed: tuple[str, ...] | None = None
    """Routers whose fp32 routing the other dtypes replayed."""
    artifact: str | None = None
    tp_ep: dict[str, Any] | None = None
    """correctness.brief: the TP/EP build check's status and items (the full check is its own record)."""


class Correctness(Record):
    """correctness's data: the ``CorrectnessRecord`` (passed on) or ``{"verdict": ...}`` (rejected)."""

    candidate: str | None = None
    tokens: int | None = None
    comparisons: tuple[Comparison, ...] = ()
    reference_downcasts: tuple[str, ...] = ()
    reference_pure_fp64: bool | None = None
    routing_replayed: tuple[str, ...] = ()
    artifact: str | None = None
    not_covered: dict[str, str] = {}
    tp_ep: dict[str, Any] | None = None
    verdict: CandidateVerdict | None = None


class StackEntry(Record):
    """A ``stack_entry`` record (commit_scope): a validated candidate committed as ``stack/<n>-<label>``."""

    position: int
    branch: str
    commit: str
    parent: str
    """The previous stack tip (or the base)."""
    linear: bool
    """``commit`` descends from ``parent``."""
    label: str
    candidate: str
    source_branch: str
    regions: tuple[str, ...]
    stack_regions_before: tuple[str, ...]
    recipe_edit: str | None
    """The recipe file that enables the regions (None: the branch enables them itself)."""
    files: tuple[str, ...]
    shared_default_edits: tuple[str, ...]
    reaching_recipes: tuple[str, ...]
    timing: str | None = None
    """How far the timing is trusted: "cuda events (gated)" or a host timer's "indicative" (None: an entry from
    before commit_scope wrote it, in a committed trail)."""
    judged: tuple[Judgement, ...]
    replay: tuple[Judgement, ...]
    confirm_rows: tuple[Cell, ...]
    correctness: tuple[Comparison, ...]
    graphs: GraphNumbers


class StackCode(Record):
    """A ``stack_code`` record (findings): the stack tip measured beside main, and its glue ops judged."""

    commit: str
    tokens: tuple[int, ...]
    regions: tuple[str, ...]
    rows: tuple[Cell, ...]
    per_tokens: tuple[dict[str, Any], ...]
    """stack_code.compare_trees per token count: a report table, kept as it is built."""
    glue_tokens: int
    call_floor_ms: float | None
    ops: tuple[dict[str, Any], ...]
    """stack_code.judge_op per glue op (compiled, ideal, measured, best known, blocker): a report table."""
    cold_compile: dict[str, Any] | None = None
    """cold_compile.measure_cold_compile: each region's compile seconds with Inductor's caches off (None: a record
    from before it)."""
    under_ac: dict[str, Any] | None = None
    """ac_retime.measure_under_ac: the stack against per-layer compile of main under selective AC (None: the
    recipe's own mode is selective, or a record from before it)."""


class StackCodePart(Record):
    """A ``stack_code_part`` record: one finished measurement of a stack tip's findings (its cells, glue ops,
    cold compile or AC re-timing), so a findings phase cut in a later one does not measure it again."""

    commit: str
    part: Literal["cells", "glue", "cold_compile", "under_ac"]
    data: Any


class RewriteDeltas(Record):
    """A ``rewrite_deltas`` record (findings): each commit of a multi-commit stack entry measured on its own."""

    commit: str
    branch: str
    tokens: tuple[int, ...]
    steps: tuple[dict[str, Any], ...]
    """rewrite_deltas.delta_steps: one report row per commit prefix."""


class PrDecision(Record):
    """A ``pr_decision`` record: the person's answer to opening the stack as draft PRs (the engine opens none)."""

    open_prs: Literal["no", "draft"]
    stack: tuple[str, ...]
