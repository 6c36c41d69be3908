"""What the add-moe-model phases hand each other: frozen, typed records.

A phase returns ``data=...`` holding these dumped to JSON; a later phase reads them back
with ``ctx.result("numerics", Numerics)``. Fields say what each number is, so an auditor
reads the format here rather than in the phases.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class Probe(BaseModel):
    """What the probe phase measured of the model, as later phases read it (the full answer is kept as is)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    hidden_size: int | None = None
    moe_intermediate_size: int | None = None
    min_layers_needed: int | None = None
    """Layers the synthetic model needs so every kind of layer the real model has is built at least once."""


class Synthetic(BaseModel):
    """The synthetic-config phase's answer."""

    model_config = ConfigDict(frozen=True, extra="allow")

    entry: dict[str, Any]
    """The model's ``_MODEL_CONFIGS``-style entry: ``model_type`` plus the config kwargs every worker builds from."""


class Verdict(BaseModel):
    """The bf16 comparison that decides the tier (the numerics worker's full result is kept as is)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    status: str
    """PASS, WARN or FAIL from the skill's KL thresholds (ERROR/SKIP when nothing was measured)."""
    kl: float | None = None
    """KL(HF || Titan) in fp32 over every output element, the skill's formula."""
    max_diff: float | None = None
    """Largest |HF - Titan| over the output."""
    firmness: dict[str, Any] | None = None
    """fp64 KL, one-ulp spread, the other experts kernel's KL (work/firmness.py)."""


DIAGNOSTIC_DTYPE = "float32"
"""The numerics phase's second comparison: fp32 on both sides, beside the bf16 verdict."""


def diagnostic_result(numerics: dict[str, Any]) -> dict[str, Any]:
    """The numerics phase's fp32-vs-fp32 row from its data ({} when it was not measured)."""
    return next((r for r in numerics.get("results") or [] if r.get("dtype") == DIAGNOSTIC_DTYPE), {})


class Numerics(BaseModel):
    """The numerics phase's answer, as later phases read it."""

    model_config = ConfigDict(frozen=True, extra="allow")

    verdict: Verdict


class GapRow(BaseModel):
    """One row of the gap-analysis table: the baseline, a recipe or agent patch, or the kernel check.

    Dumped with ``exclude_unset``: a row holds exactly the fields its kind sets.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    label: str
    """"baseline", "+<recipe>", the agent's label, or "+kernel align"."""
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
    """Kernel check only: the residual is a verified kernel or router-precision difference."""
    hf_kernel_on_titan_weights_max_diff: float | None = None
    titan_kernel_on_hf_routing_max_diff: float | None = None

    def as_data(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_unset=True)
