"""Records of the compatibility probe, shared by the engine phase and the worker (no torch).

``CompatReport`` holds the skill's 1g fields in snake_case plus the evidence behind the
verdicts (round-trip and strict-load details, the target's own probe output, notes), so a
reader of compat_report.json can see why a field says FAIL without re-running anything.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from phases.add_moe_model.model_source import ModelSource
from phases.add_moe_model.workspace import EXP as EXP_DIR

Severity = Literal["fixable", "blocker", "core"]
EXP = EXP_DIR.rstrip("/")  # fix locations and script paths join it with "/"


class CompatIssue(BaseModel):
    """One finding. ``fixable``: edit under EXP and re-probe; ``blocker``: needs HF
    upstream (stop); ``core``: the fix needs a path outside EXP (escalate)."""

    model_config = ConfigDict(frozen=True)

    code: str
    message: str
    fix_location: str
    severity: Severity


class KeyCheck(BaseModel):
    """Evidence of a state-dict comparison (round trip or strict load)."""

    verdict: Literal["PASS", "FAIL"]
    missing: list[str] = []
    unexpected: list[str] = []
    shape_mismatch: list[str] = []
    max_abs_diff: float | None = None
    """Largest |value| difference after the round trip of the tiny materialized model."""
    checked_keys: int = 0
    note: str = ""


class CompatReport(BaseModel):
    """compat_report.json: Phase 1's verdict for one model on one target checkout."""

    model_id: str
    model_type: str
    hidden_size: int | None
    intermediate_size: int | None
    moe_intermediate_size: int | None
    num_attention_heads: int | None
    num_key_value_heads: int | None
    num_hidden_layers: int
    num_experts: int | None
    top_k: int | None
    score_func: str | None
    route_norm: bool | None
    shared_experts: Literal["none", "additive", "sigmoid-gated", "layer-level"] | None
    attention: Literal["gqa", "mla", "mla+dsa", "linear", "custom", "hybrid", "none"]
    attention_layers: list[str] = []
    moe_layers: list[int]
    dense_layers: list[int]
    moe_mechanism: str
    min_layers_needed: int | None
    state_dict_roundtrip: Literal["PASS", "FAIL"]
    strict_load: Literal["PASS", "FAIL"]
    issues: list[CompatIssue]
    roundtrip_detail: KeyCheck
    strict_load_detail: KeyCheck
    target_probe: dict[str, Any] | None
    """What the target's ``_probe_hf_moe_block`` / ``_probe_layer_level_moe`` returned."""
    moe_attr: str | None
    """Decoder-layer attribute holding the MoE block ("mlp", "feed_forward", "<layer>")."""
    built_layers: int
    """Decoder layers actually built on meta (enough to reach the first MoE layer)."""
    notes: list[str]
    timings_s: dict[str, float]
    torchtitan_path: str
    """``torchtitan.__file__`` in the worker: proves which checkout was probed."""


class ProbeRequest(BaseModel):
    """Input of ``work.probe:probe``."""

    source: ModelSource


class WorkerError(BaseModel):
    code: str
    message: str


class ProbeResponse(BaseModel):
    """Output of ``work.probe:probe``: a report, or an error that names what to pass."""

    report: CompatReport | None = None
    error: WorkerError | None = None
