"""Result records of the measurement kit (stdlib + pydantic only; no torch).

Every measurement function in ``phases.kit`` returns one of these frozen pydantic models
with all raw samples, never only a median. They are pydantic (not dataclasses) because
they cross the worker boundary: a worker dumps them with ``model_dump(mode="json")`` and
the phase validates them back. A row that cannot run on this machine (CUDA-graph replay,
peak memory, GPU polling on a CPU host) is a ``NotApplicable`` with the reason, never a
fake number. Derived numbers (median, spread, TB/s) sit next to the samples they come from.
"""

from __future__ import annotations

import statistics
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Record(BaseModel):
    """Base of every kit record: frozen, no unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class NotApplicable(Record):
    """A row that does not apply here, e.g. CUDA-graph replay on a CPU host."""

    status: Literal["not_applicable"] = "not_applicable"
    reason: str
    """Why, e.g. "no CUDA device"."""


def median_of(samples: tuple[float, ...]) -> float:
    """Median of raw samples (NaN when there are none, so an empty row cannot pass)."""
    return statistics.median(samples) if samples else float("nan")


def spread_pct_of(samples: tuple[float, ...]) -> float:
    """Largest deviation from the median, in percent of the median."""
    if not samples:
        return float("nan")
    med = statistics.median(samples)
    return max(abs(s - med) for s in samples) / med * 100.0 if med else float("nan")


class PeakMemory(Record):
    """``torch.cuda.max_memory_allocated`` after the timed loop (stats reset before it)."""

    bytes: int

    @property
    def gib(self) -> float:
        return self.bytes / 2**30


class Timing(Record):
    """Per-iteration times of one step function."""

    samples_ms: tuple[float, ...]
    """One value per timed iteration, in milliseconds."""
    warmup: int
    """Warm-up calls before timing (the first one is timed apart as compile_ms)."""
    timer: Literal["cuda_events", "host", "cuda_graph_replay"]
    """cuda_events: a CUDA event pair per iteration; host: time.perf_counter around each call."""
    compile_ms: float | None = None
    """Wall time of the first call (compile + first run); None when not recorded."""
    peak_memory: PeakMemory | NotApplicable
    device: str

    @property
    def median_ms(self) -> float:
        return median_of(self.samples_ms)

    @property
    def spread_pct(self) -> float:
        return spread_pct_of(self.samples_ms)


Family = Literal[
    "gemm", "attention", "norm", "cat/copy", "pointwise", "reduction",
    "scatter/gather", "sort", "other",
]
GLUE_EXCLUDED: tuple[str, ...] = ("gemm", "attention")


class KernelRow(Record):
    """One profiler key (a kernel on CUDA, a host op on CPU)."""

    name: str
    family: Family
    count_per_step: float
    """Calls per step; key_averages merges same-name kernels, so attribute with this."""
    us_per_step: float
    """Total time of this key per step (device time on CUDA, self CPU time on CPU)."""


class FamilySummary(Record):
    family: Family
    count_per_step: float
    ms_per_step: float


class KernelTable(Record):
    """Profiler table over ``steps`` steps, sorted by time per step."""

    rows: tuple[KernelRow, ...]
    steps: int
    activity: Literal["cuda", "cpu"]
    note: str
    """What the rows are: device kernels, or host ops when no CUDA device exists."""
    families: tuple[FamilySummary, ...]

    @property
    def total_ms_per_step(self) -> float:
        return sum(r.us_per_step for r in self.rows) / 1e3

    @property
    def count_per_step(self) -> float:
        return sum(r.count_per_step for r in self.rows)

    @property
    def glue_ms_per_step(self) -> float:
        return sum(f.ms_per_step for f in self.families if f.family not in GLUE_EXCLUDED)


class GraphCount(Record):
    """Compiled graphs after ``torch._dynamo.reset()`` and one pass over every shape."""

    unique_graphs: int
    """``counters["stats"]["unique_graphs"]`` over the whole pass."""
    per_function: dict[str, int]
    """Cache entries per region function (one entry per graph)."""
    recompile_limit: int
    target: int
    """Most graphs allowed per function with headroom: 75% of the limit (6 of 8)."""
    limit_hit: str = ""
    """The recompile-limit error raised during the pass ("" when none); counts are partial."""
    recompile_reasons: dict[str, str] = {}
    """Per function that recompiled: the last guard that failed, e.g. "tensor 'x' size mismatch at index 1"."""

    @property
    def worst(self) -> int:
        return max(self.per_function.values(), default=self.unique_graphs)

    @property
    def within_limit(self) -> bool:
        return not self.limit_hit and self.worst <= self.recompile_limit

    @property
    def within_target(self) -> bool:
        return self.within_limit and self.worst <= self.target


class Bandwidth(Record):
    """Copy bandwidth: TB/s = 2 * bytes * copies / seconds / 1e12 (read + write)."""

    tbs: float
    nbytes: int
    copies: int
    seconds: float
    warmup: int
    kind: Literal["hbm", "host_memcpy"]
    label: str


class GemmRate(Record):
    """Achieved matmul rate: TFLOP/s = 2 * size^3 * reps / seconds / 1e12, measured here (the FLOP floor's rate)."""

    tflops: float
    size: int
    reps: int
    seconds: float
    dtype: str
    label: str


class AttentionCount(Record):
    """What one step's ``scaled_dot_product_attention`` calls must compute (matmul FLOPs from their shapes)."""

    calls: int
    shapes: tuple[str, ...]
    """Distinct q/k/v shapes, each with causal, mask or full."""
    flops_fwd: int
    flops_fwdbwd: int
    """Forward plus backward (twice the forward matmuls)."""
    kernels: tuple[str, ...] = ()
    """The profile's attention-family kernel (or host op) names: the backend that really ran."""


class OpBytes(Record):
    """Bytes one aten op really reads and writes (tensor args in, tensor results out)."""

    op: str
    phase: Literal["fwd", "bwd"]
    bytes_read: int
    bytes_written: int
    shapes: tuple[str, ...]

    @property
    def bytes_moved(self) -> int:
        return self.bytes_read + self.bytes_written


class RankItem(Record):
    """An input row of the ranking."""

    name: str
    measured_ms: float
    ideal_ms: float
    layer_ms: float
    """Time of the whole layer (or step) the op belongs to."""
    fixes_correctness: bool = False
    removes_host_sync: bool = False


class Ranked(Record):
    candidate: RankItem
    share_of_layer: float
    """measured_ms / layer_ms."""
    score_ms: float
    """(measured - ideal) * share_of_layer."""
    gain_share: float
    """(measured - ideal) / layer_ms: the most this fix can save, as a share of the layer."""
    kept_because: str
    """Why a sub-threshold item was kept ("" when it is above the threshold)."""


class StopDecision(Record):
    stop: bool
    reason: str
    threshold: float
    top: Ranked | None


class ScreenResult(Record):
    """In-process interleaved screen: ranking only, never a cited number."""

    samples_ms: dict[str, tuple[float, ...]]
    """Every per-iteration sample of each variant, all rounds pooled in round order."""
    orders: tuple[tuple[str, ...], ...]
    """The variant order of each round (rotated)."""
    timer: str
    device: str

    def medians(self) -> dict[str, float]:
        return {name: median_of(s) for name, s in self.samples_ms.items()}


class RunOutcome(Record):
    """One fresh process of a confirmation."""

    index: int
    status: Literal["ok", "FAILED"]
    result: dict | None
    returncode: int
    foreign_pids: tuple[int, ...] = ()
    """GPU compute processes seen during the run that were not this run's."""
    host_load: float | None = None
    """The highest 1-minute load average of the host seen while it ran (its own threads count too)."""
    log_tail: str = ""


class TensorDiff(Record):
    name: str
    """"output" or the grad's name, e.g. "grad:layers.0.mlp.w1.weight", "grad:input0"."""
    rel_l2: float
    within: bool
    norm: float | None = None
    """L2 norm of the candidate's tensor (a zero grad shows as rel L2 1.0 and norm 0)."""
    reference_norm: float | None = None
    noise_band: float | None = None
    """Rel L2 the reference itself moves by when its inputs move one ulp (the skill's noise band)."""
    eager_error: float | None = None
    """Against an fp64 reference: eager's own rel L2 at the same dtype, the error this one may exceed by the
    tolerance at most."""


class Comparison(Record):
    """One candidate-vs-reference pair at one dtype."""

    label: str
    """E.g. "bf16 candidate vs bf16 eager"."""
    tolerance: float
    diffs: tuple[TensorDiff, ...]

    @property
    def ok(self) -> bool:
        return bool(self.diffs) and all(d.within for d in self.diffs)

    @property
    def worst(self) -> TensorDiff | None:
        return max(self.diffs, key=lambda d: d.rel_l2, default=None)


class Correctness(Record):
    comparisons: tuple[Comparison, ...]
    reference_dtype: str
    reference_downcasts: tuple[str, ...] = Field(default=())
    """Ops in the fp64 reference whose floating outputs were not fp64 (must be empty)."""
    seed: int | None

    @property
    def ok(self) -> bool:
        return not self.reference_downcasts and all(c.ok for c in self.comparisons)
