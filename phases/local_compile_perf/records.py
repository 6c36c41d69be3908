"""What the local-compile-perf phases hand each other: frozen, typed records.

A phase returns ``data=record.model_dump(mode="json")``; a later phase reads it back with
``ctx.result("plan", Plan)``. The fields say what each number is, so an auditor reads the
format here rather than in the phases.
"""

from __future__ import annotations

from typing import Any, Literal

from phases.kit.harness import HarnessSpec, TimingKnobs
from phases.kit.records import Record


class Sizes(Record):
    """How big and how long every measurement of the run is, and why."""

    tokens: tuple[int, ...]
    """Packed tokens per rank, small to large (at least 3 counts)."""
    per_layer_tokens: tuple[int, ...]
    """Token counts where the per-layer compile tree is measured."""
    timing: TimingKnobs
    runs: int
    """Fresh processes per cited number."""
    source: str
    """"given" (every size passed as an option), "cuda defaults" or "cpu defaults" (some filled in)."""
    why: str
    """Why these sizes: the skill's on CUDA, or what a CPU host can finish."""


class Plan(Record):
    """The plan phase's answer: the target, the device, the sizes, the budget and the stop rule."""

    harness: str
    """Harness factory ref loaded by every worker."""
    kind: str
    """embedded, hf or tree."""
    device: str
    device_name: str
    torch: str
    spec: HarnessSpec
    sizes: Sizes
    budget: str
    budget_s: float
    stop_threshold: float
    """Stop when the remaining gap or the next gain is under this share of the layer."""
    correctness_tokens: int
    delta_tokens: tuple[int, ...] = ()
    """Token counts of the findings' per-rewrite deltas; () = every per-layer count (runs before the option)."""
    rewrite_deltas: bool = True
    """False: the findings leave each rewrite's own delta out (the run's --rewrite-deltas no)."""
    per_layer_stack: bool = True
    """False: the findings leave per-layer compile of the stack's own code out (the run's --per-layer-stack no)."""
    inventory: dict[str, Any]
    """Region API, region declarations, override kernels, fp32 precision (plan.probe_inventory)."""
    started_at: str

    @property
    def left_out(self) -> tuple[str, ...]:
        """What the run's options leave out of the findings, each with the option that did."""
        return tuple(text for on, text in (
            (self.per_layer_stack, "per-layer compile of the stack's own code (the rewrites' share of the gain apart "
                                   "from the regions'): --per-layer-stack no"),
            (self.rewrite_deltas, "each rewrite's own delta within a stack entry: --rewrite-deltas no")) if not on)

    @property
    def cuda(self) -> bool:
        """True when the run times on a CUDA device (CUDA events), False on a host timer."""
        return self.device.startswith("cuda")

    @property
    def tokens(self) -> tuple[int, ...]:
        return self.sizes.tokens

    @property
    def timing(self) -> TimingKnobs:
        return self.sizes.timing


class PreparedCandidate(Record):
    """A submitted branch replayed on the stack tip as one commit, in its own worktree (stack.prepare_candidate)."""

    n: int
    """1 for the run's first candidate, then 2, 3, ..."""
    name: str
    """``<n>-<slug of the label>``: names the wip, rejected and worktree paths."""
    tip: str
    """The stack tip commit the candidate was replayed on."""
    commits: tuple[str, ...]
    """The submitted branch's commits beyond its merge base with the tip."""
    wip_branch: str
    wip_commit: str
    stack_checkout: str
    """Worktree of the tip (detached): the stack side of every comparison."""
    candidate_checkout: str
    files: tuple[str, ...]
    candidate_regions: tuple[str, ...]
    regions_source: str
    """"named by the submission" or "none named": a candidate enables only the regions it names."""
    stack_regions: tuple[str, ...]
    """Regions the stack's recipe enables before this candidate."""

    @property
    def tree_regions(self) -> list[str]:
        """The regions of the candidate's tree: the stack's, then the candidate's new ones."""
        return list(dict.fromkeys([*self.stack_regions, *self.candidate_regions]))


class Candidate(Record):
    """The candidate under test: the submission and, once replayed, its worktrees."""

    id: str
    branch: str
    label: str
    regions: tuple[str, ...] = ()
    untouched_regions: dict[str, str] = {}
    """``{region: path}`` of the named regions the branch's changes do not touch (enabled as they are)."""
    actor: str
    tool_call_id: str | None = None
    submitted_at: str
    prepared: PreparedCandidate | None = None
    """None when the branch could not be replayed on the stack tip."""


class Picked(Record):
    """pick_fix's answer when it passes a candidate on to the checks."""

    candidate: Candidate


class Judgement(Record):
    """The candidate against the stack at one token count, from two cited cells."""

    tokens: int
    metric: str
    """"wall_ms" (normal launch) or "replay_ms" (CUDA-graph replay)."""
    stack: float
    candidate: float
    delta_pct: float
    """(candidate - stack) / stack, in percent: negative is faster."""
    noise_band_pct: float
    """The larger spread of the two cells' fresh-process samples (kit spread_pct_of)."""
    verdict: Literal["win", "neutral", "loss", "indicative"]
    """"indicative" on a host timer: its deltas are recorded, never ruled a win or a loss."""


class Cell(Record):
    """One (variant, tokens) cell of a fresh-process confirmation: cited medians with every sample."""

    variant: str
    """E.g. "eager", "upstream", "per_layer", "stack", "candidate"."""
    tree: str
    tokens: int
    status: Literal["measured", "failed", "not_applicable"]
    reason: str = ""
    """Why a cell is failed or not applicable ("" when measured)."""
    checkout: str = ""
    runs_ok: int = 0
    runs_asked: int = 0
    foreign_pids: tuple[int, ...] = ()
    """GPU compute processes seen during its runs that were not theirs."""
    host_load: float | None = None
    """The highest 1-minute load average of the host during its runs (None: not sampled)."""
    failed: tuple[dict[str, Any], ...] = ()
    """{index, returncode, log_tail} of each FAILED fresh process."""
    samples: dict[str, tuple[float, ...]] = {}
    """Per metric (wall_ms, replay_ms, kernel_ms, glue_ms): one value per fresh process."""
    cited: dict[str, float] = {}
    """Per metric: the median of its samples, the number the docs cite."""
    not_applicable: dict[str, str] = {}
    kernel_count: float | None = None
    families: tuple[dict[str, Any], ...] = ()
    """Kernel families of the first process: {family, count_per_step, ms_per_step}."""
    regions: tuple[str, ...] = ()
    peak_gib: float | None = None
    compile_ms: tuple[float | None, ...] = ()
    provenance: dict[str, Any] | None = None
    """Command, device, versions, commit (None in the slim copies phases hand on)."""
    spec: dict[str, Any] | None = None
    candidate_id: str | None = None
    attention: dict[str, Any] | None = None
    """The eager tree's kit AttentionCount (first process): FLOPs per step and the backend's kernel names."""

    def slim(self) -> "Cell":
        """The cell without its bulky provenance (that is in the measurement events)."""
        return self.model_copy(update={"provenance": None, "spec": None})


class AttentionFloor(Record):
    """Step 1's attention check at one token count: eager attention time against its FLOP floor."""

    tokens: int
    calls: int
    shapes: tuple[str, ...]
    flops_fwdbwd: int
    floor_ms: float
    """flops_fwdbwd at the GEMM rate measured on this device."""
    measured_ms: float
    """The eager profile's attention family, per step."""
    ratio: float
    largest: bool
    """Attention is the eager step's largest kernel family."""
    kernels: tuple[str, ...]
    note: str


class Baselines(Record):
    """The baselines phase's answer: trap findings and every cell of the three trees."""

    traps: dict[str, Any]
    rows: tuple[Cell, ...]
    gpu_poll: str
    orders: tuple[tuple[str, ...], ...]
    gemm_rate: dict[str, Any] | None = None
    """The kit GemmRate the attention floor divides by (None before this check existed, or with no SDPA call)."""
    attention: tuple[AttentionFloor, ...] = ()


CheckStatus = Literal["PASS", "FAIL", "UNRUN"]


class ParamShard(Record):
    """One parameter on one rank of the TP/EP build check."""

    name: str
    global_shape: tuple[int, ...]
    local_shape: tuple[int, ...]
    placement: str
    """DTensor placements, e.g. "S(0)" (Shard(0)), or "plain (replicated)"."""
    degree: int
    """Ranks the parameter is placed over (1 for a plain one)."""
    ok: bool
    """The local shape is the global one with the sharded dim divided by ``degree``."""


class RankRun(Record):
    """One simulated rank's fwd+bwd steps of the TP/EP build check."""

    rank: int
    tokens: tuple[int, ...]
    """Tokens of each step, one fwd+bwd each."""
    zero_tokens: bool
    """The routers were biased so this rank's local experts get no row."""
    status: CheckStatus
    error: str = ""
    rows_sent: tuple[int, ...] = ()
    """Per step: rows this rank's MoE layers sent to the experts' ranks."""
    rows_received: tuple[int, ...] = ()
    """Per step: rows its local experts computed (peer model: see ``ParallelBuildCheck.note``)."""
    empty_expert_calls: int = 0
    """(layer, step, local expert) triples with no row."""
    graphs_after: dict[str, int] = {}
    """Compiled graphs per region after this rank's steps (one process: earlier ranks' graphs included)."""
    stand_ins: tuple[str, ...] = ()
    """Exchanges the fake process group cannot copy, replaced by zeros of the right shape."""


class ParallelBuildCheck(Record):
    """The correctness phase's TP/EP build check of one checkout at the target world size (fake process group).

    A build check: shapes, graphs, no crash. The fake backend moves no data, so no number here is a
    numeric result. ``items`` say what passed; ``status`` is FAIL when any item failed, UNRUN when the
    check could not run at all (``reason`` says why)."""

    status: CheckStatus
    reason: str = ""
    world_size: int
    tp: int
    ep: int
    regions: tuple[str, ...] = ()
    compile_backend: str = "inductor"
    build_dims: dict[str, int] = {}
    """The stepped layer's dims: DSv3's head, expert and group counts, narrow widths."""
    items: dict[str, CheckStatus] = {}
    """shapes_real, shapes_build, one per rank run (``rank_N``), zero_token_graphs, graph_budget."""
    failures: dict[str, str] = {}
    """Why each failed item failed."""
    shapes_real: tuple[ParamShard, ...] = ()
    """Rank 0's parameters at the real DSv3 dims, built on meta."""
    shapes_build: tuple[ParamShard, ...] = ()
    """Rank 0's parameters of the stepped layer."""
    ranks: tuple[RankRun, ...] = ()
    graphs: dict[str, int] = {}
    """Graphs per region after the ranks that got tokens."""
    zero_token_growth: dict[str, int] = {}
    """Graphs per region the zero-token rank added (0 everywhere: no recompile for the empty case)."""
    recompile_reasons: tuple[str, ...] = ()
    """Dynamo's guard failures behind that growth."""
    graph_breaks: int = 0
    recompile_limit: int = 0
    target: int = 0
    """Most graphs per region with headroom (graph budget: 6 of 8)."""
    torch: str = ""
    note: str = ""
    """What the fake process group does and does not show."""

    @property
    def failed_items(self) -> tuple[str, ...]:
        return tuple(name for name, status in self.items.items() if status == "FAIL")


class TpEpVerdict(Record):
    """The correctness phase's ruling on the TP/EP build check of one candidate (phases/local_compile_perf/tp_ep)."""

    candidate: str
    check: ParallelBuildCheck
    """The candidate checkout's check, with its tree's regions."""
    stack_items: dict[str, CheckStatus] = {}
    """The stack tip's items, with the stack's regions; checked only when the candidate failed an item."""
    blocking: tuple[str, ...] = ()
    """Failed items that reject the candidate: shapes, a rank's crash, the graph budget, where the stack passes."""
    findings: tuple[str, ...] = ()
    """Failed or unrun items that do not reject it, each with why (the stack's too, or a recompile within budget)."""
