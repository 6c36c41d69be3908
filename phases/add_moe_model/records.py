"""What the add-moe-model phases hand each other: frozen, typed records.

A phase returns ``data=...`` holding these dumped to JSON; a later phase reads them back
with ``ctx.result("numerics", Numerics)``. Fields say what each number is, so an auditor
reads the format here rather than in the phases.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from phases.add_moe_model.compat import CompatIssue, KeyCheck, LayerKind, PlannedLayer
from phases.add_moe_model.tree_scripts import TreeScriptVerdict
from phases.add_moe_model.work.build_check import WorldResult
from phases.add_moe_model.work.numerics import RoundTrip
from phases.add_moe_model.work.pretrained import PretrainedResult


class Preflight(BaseModel):
    """The pre-flight phase's answer: the branch the run works on and whether it commits."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    branch: str
    """The checked-out branch ("(detached)" when the person chose the current, detached HEAD)."""
    auto_commit: bool
    """The person answered commit=auto: the commit phase commits; else it leaves the changes for review."""
    base_commit: str


class Probe(BaseModel):
    """What the probe phase measured of the model, as later phases read it.

    The data is the worker's whole ``CompatReport``; extra keys are allowed so the fields no phase reads
    (timings, notes, the target probe, ...) stay as the report has them without being listed twice.
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    model_type: str
    hidden_size: int | None = None
    moe_intermediate_size: int | None = None
    min_layers_needed: int | None = None
    """The skill's 1g field: layers up to and including the first MoE layer (the synthetic entry holds one layer of
    each kind instead, ``Synthetic.layers``)."""
    state_dict_roundtrip: str | None = None
    """PASS or FAIL (None only in hand-made reports of tests)."""
    strict_load: str | None = None
    """PASS or FAIL: the real model's layer loaded strictly at real size; numerics quotes it beside its own."""
    strict_load_detail: KeyCheck | None = None
    issues: tuple[CompatIssue, ...] = ()
    """Fixable, core and blocker findings; the probe_clean gate and the numerics load check read them."""
    layer_kinds: tuple[LayerKind, ...] = ()
    """Every kind of decoder layer of the real model, with its indices and what the probe ran on it: the one
    description later phases report against (empty in runs from before it)."""
    waived: dict[str, str] = {}
    """Finding code -> a person's reason (``orchestrator.waivers``)."""


class Synthetic(BaseModel):
    """The synthetic-config phase's answer."""

    model_config = ConfigDict(frozen=True, extra="allow")

    entry: dict[str, Any]
    """The model's ``_MODEL_CONFIGS``-style entry: ``model_type`` plus the config kwargs every worker builds from."""
    layers: tuple[PlannedLayer, ...] = ()
    """Which kind of the real model each layer of the entry holds (empty in runs from before it)."""
    layer_note: str = ""
    """Why the entry has the layers it has."""
    waived: dict[str, str] = {}


class Verdict(BaseModel):
    """The bf16 comparison that decides the tier (the numerics worker's full result is kept as is)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    status: str
    """PASS, WARN or FAIL from the skill's KL thresholds (ERROR/SKIP when nothing was measured)."""
    kl: float | None = None
    """KL(HF || Titan) in fp32 over every output element, the skill's formula."""
    max_diff: float | None = None
    """Largest |HF - Titan| over the output."""
    cos_sim: float | None = None
    dtype: str = ""
    """bfloat16 for the verdict, float32 for the diagnostic row."""
    error: str | None = None
    roundtrip: RoundTrip | None = None
    """Whole-model HF -> Titan -> HF state-dict round trip (None only in hand-made verdicts of tests)."""
    firmness: dict[str, Any] | None = None
    """fp64 KL, one-ulp spread, the other experts kernel's KL (work/firmness.py)."""


DIAGNOSTIC_DTYPE = "float32"
"""The numerics phase's second comparison: fp32 on both sides, beside the bf16 verdict."""


class Numerics(BaseModel):
    """The numerics phase's answer, as later phases read it.

    Extra keys are allowed: a person's waiver adds ``waived`` and a later version may attach another
    comparison; the keys below are every one the phase writes today.
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    verdict: Verdict
    results: tuple[Verdict, ...] = ()
    """Every dtype's comparison, the verdict's and the fp32 diagnostic's."""
    diagnostic_flags: tuple[str, ...] = ()
    diagnostic_readings: tuple[str, ...] = ()
    """What each diagnostic comparison can say (tier_text.diagnostic_reading): KL and max_diff, and which side's
    matmuls ran below its dtype."""
    triage: str | None = None
    """Why the tier's route was taken or overridden (set only when the triage said so)."""
    measured_tree: dict[str, str | None] | None = None
    """Blob id of every experiment-folder file numerics measured (measured_tree.py); None in runs from before it."""
    pretrained: PretrainedResult | None = None
    """The Phase 3b comparison on the ``--weights`` checkpoint (None without ``--weights``)."""
    tree_script: TreeScriptVerdict | None = None
    """The target's own numerical_equivalence.py, when numerics ran it."""
    verdict_standing: dict[str, str] | None = None
    """{"stands": "builtin" | "tree_script", "why": ...}: which of the two verdicts stands."""
    waived: dict[str, str] = {}


def diagnostic_result(numerics: Numerics) -> Verdict | None:
    """The numerics phase's fp32-vs-fp32 row (None when it was not measured)."""
    return next((r for r in numerics.results if r.dtype == DIAGNOSTIC_DTYPE), None)


class GapRow(BaseModel):
    """One row of the gap-analysis table: the baseline, a recipe, hypothesis or agent patch, or a stage trace.

    Dumped with ``exclude_unset``: a row holds exactly the fields its kind sets.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    label: str
    """"baseline", "+<recipe>", the agent's label, "trace" (or "+kernel align" in runs from before the trace)."""
    patch_id: str | None
    """The ledger's id of the temporary patch this row measured; None when no patch was applied."""
    attempt: int
    """The phase attempt the row belongs to (an interrupted attempt's rows stay in the trail)."""
    max_diff: float | None
    """bf16 max |HF - Titan| with every patch so far applied."""
    kl: float | None
    """bf16 KL with every patch so far applied (None where not measured)."""
    description: str
    """What the row changed, or why it did not apply."""
    log: str
    """The artifact holding the worker's log for this row."""
    status: str | None = None
    """The tier of the patched tree's measurement."""
    kernel_verified: bool | None = None
    """Trace (or kernel check) only: the residual is a verified kernel difference (HF's experts kernel on Titan's
    transferred weights gives 0.00 in Titan's block)."""
    hf_kernel_on_titan_weights_max_diff: float | None = None
    titan_kernel_on_hf_routing_max_diff: float | None = None
    first_divergence: str | None = None
    """Trace only: the first stage (router logits, routing, expert outputs, ...) where HF and Titan differ."""
    trace: dict[str, Any] | None = None
    """Trace only: the stage trace as measured (work/stage_trace.py's TraceResult)."""
    trace_table: str | None = None
    """Trace only: the artifact with the stage table."""

    def as_data(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_unset=True)


class GapAnalysis(BaseModel):
    """The gap-analysis phase's answer: its rows, and the proof every temporary patch was reverted.

    While it waits for the agent the data holds the rows alone (``reverted`` empty).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    rows: tuple[GapRow, ...]
    reverted: dict[str, str] = {}
    """Core path -> its blob id after the revert (the base's: nothing stays patched)."""
    waived: dict[str, str] = {}
    explanation: str = ""
    """How the residual ends, in the rows' own words: the patch that brought max_diff to 0 and the trace finding it
    tested, a verified kernel difference, or "not explained" (empty in runs from before it)."""


class BuildCheckRow(WorldResult):
    """One world size of the sharding build check, as the parallelism phase keeps it.

    The worker's ``WorldResult``, with one status it cannot give: UNSUPPORTED, when the target declares
    the layout unsupported (parallelism.declared_unsupported rewrites FAIL to it).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: str
    """PASS, FAIL or UNSUPPORTED."""


class TorchrunRow(BaseModel):
    """One torchrun row of the parallelism matrix (parallel_matrix.base_record, row_from_run; parallel_jobs)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    config: str
    """"FSDP-1gpu", "FSDP", "FSDP+EP", ..."""
    world_size: int
    tp: int
    ep: int
    command: str
    status: str
    """PASS, FAIL, UNRUN or WAITING (a cluster job in flight)."""
    error: str = ""
    root_cause: str = ""
    fixable: bool | None = None
    """Set on FAIL: the cause is the agent's to fix (else torch, the cluster, the machine)."""
    log: str | None = None
    """The artifact of the row's log (None when it did not run)."""
    ran: bool = False
    returncode: int | None = None
    steps: tuple[dict[str, Any], ...] = ()
    """{step, loss} of each training step the log shows."""
    torch_compat: tuple[Any, ...] = ()
    """The torch-compat shim's announcement, when the log has one."""
    job: dict[str, Any] | None = None
    """The cluster job's key, id, state, reason and source (``--executor slurm`` only)."""
    source: str | None = None
    """"handed back from DIR" on a row ``resume --results`` took (a ``parallelism_row`` record)."""


class Parallelism(BaseModel):
    """The parallelism phase's answer (also while it waits for a person or a job: the same data)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    build_check: tuple[BuildCheckRow, ...]
    rows: tuple[TorchrunRow, ...]
    gpus: int
    fsdp: dict[str, Any]
    """The FSDP probe: {ok, accepts_dp_mesh_dims, torch, error}."""
    torch_compat: dict[str, Any]
    """{torch, applied}: the shims the trainer assets applied."""
    tree: dict[str, Any] | None = None
    """The target's commit and status the rows ran on (None in runs from before it was kept)."""
    waived: dict[str, str] = {}


class Results(BaseModel):
    """Every result an add-moe run holds so far, each as its phase's ``returns`` model (None until it has one).

    For the code that reads several phases at once from a snapshot (caveats, the compat doc, the survey);
    a phase reads one result with ``ctx.result(name)``. tests/test_moe_doc_commit.py holds these fields to
    the table's ``returns=``.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    preflight: Preflight | None = None
    probe: Probe | None = None
    synthetic_config: Synthetic | None = None
    numerics: Numerics | None = None
    gap_analysis: GapAnalysis | None = None
    parallelism: Parallelism | None = None

    def waived(self) -> dict[str, dict[str, str]]:
        """Phase -> {code: reason} of every finding a person waived."""
        phases = {"probe": self.probe, "synthetic_config": self.synthetic_config, "numerics": self.numerics,
                  "gap_analysis": self.gap_analysis, "parallelism": self.parallelism}
        return {name: p.waived for name, p in phases.items() if p is not None and p.waived}


class CommitRecord(BaseModel):
    """A ``commit`` record: what the commit phase committed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hash: str
    branch: str
    files: tuple[str, ...]


class NeEntryWritten(BaseModel):
    """A ``ne_entry_written`` record: the synthetic entry was added to the tree's numerical_equivalence.py."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    model_type: str


class TreeScriptRecord(TreeScriptVerdict):
    """A ``tree_script_verdict`` record: the tree script's verdict (without its MoE inputs) and which stands."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stands: str
    """"builtin" or "tree_script"."""
    why: str


class Remeasure(BaseModel):
    """A ``remeasure`` record: the experiment folder changed after numerics measured it (measured_tree.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    phase: str
    """compat_doc or commit: the phase that found the change and sent the run back."""
    changes: tuple[str, ...]
    measured: dict[str, str | None] | None
    """What numerics measured (None in a run from before it kept the snapshot)."""
    now: dict[str, str | None]
