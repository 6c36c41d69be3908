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


class LayerKind(BaseModel):
    """One distinct kind of decoder layer of the real model, with its indices (work/layer_kinds.py)."""

    model_config = ConfigDict(frozen=True)

    name: str
    """The attention kind (with the config's layer type) x the MLP kind, e.g. "linear (linear_attention) x dense"."""
    attention: str
    """gqa | mla | mla+dsa | linear | custom | none: what the layer's sequence mixer is."""
    attention_module: str
    """The mixer's attribute and class, e.g. "self_attn (BailingHybridDeltaAttention)"; "none" without one."""
    mlp: str
    """moe | moe (layer-level) | dense | none."""
    mlp_module: str
    config: dict[str, Any] = {}
    """The config's per-layer values of these layers, e.g. {"layer_types": "linear_attention"}."""
    layers: list[int]
    """The real model's layer indices of this kind."""
    checked: list[str] = []
    """What the probe ran on this kind with the target's code, on meta at real size."""
    findings: list[str] = []
    """Codes of the probe's findings on this kind; empty when every check of ``checked`` passed."""

    @property
    def ranges(self) -> str:
        return index_ranges(self.layers)


def index_ranges(indices: list[int]) -> str:
    """"0-4, 6-10, 12" for [0, 1, 2, 3, 4, 6, ..., 10, 12]."""
    parts, start = [], None
    for i, index in enumerate(indices):
        start = index if start is None else start
        if i + 1 == len(indices) or indices[i + 1] != index + 1:
            parts.append(str(index) if start == index else f"{start}-{index}")
            start = None
    return ", ".join(parts)


class PlannedLayer(BaseModel):
    """One layer of a scaled config (the synthetic entry, the tiny twin) and the real kind it holds."""

    layer: int
    """Index in the scaled model."""
    real_layer: int
    """The real layer it copies."""
    kind: str | None
    """The name of the real kind it holds (None: the built layer matches no kind of the real model)."""


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
    """One line per sequence mixer: its layers, its kind, attribute and class."""
    layer_kinds: list[LayerKind] = []
    """Every distinct kind of decoder layer of the real model, with its indices and what the probe ran on it."""
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
    """Decoder layers built on meta: all of the real config's."""
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
