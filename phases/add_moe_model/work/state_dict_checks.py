"""State-dict round trip and strict load through the target's adapter (worker side).

The round trip (skill 1f) only proves the adapter is its own inverse: a key the converter
misnames on the way in and un-misnames on the way out passes. The strict load is stronger:
the converted keys of one MoE layer must be exactly the keys, with exactly the shapes, of
the Titan MoE that the target builds from its own probe. Keys and shapes are compared on
meta at real size; values are compared on a tiny materialized model.
"""

from __future__ import annotations

from typing import Any

from phases.add_moe_model.compat import CompatIssue, KeyCheck
from phases.add_moe_model.work.hf_checks import STATE_DICT_ADAPTER

_LISTED = 12
NO_TINY_TWIN = "values not compared: the tiny materialized model could not be built"
SCALED_CONFIG = "phases/add_moe_model/work/scaled_config.py"


def check_roundtrip(adapter: Any, hf_sd: dict[str, Any], *, tiny_sd: dict[str, Any] | None,
                    tiny_error: str = "") -> KeyCheck:
    """Convert HF -> Titan -> HF; keys and shapes at real size, values on the tiny model."""
    back = adapter.titan_to_hf_moe_state_dict(adapter.hf_to_titan_moe_state_dict(hf_sd))
    missing = sorted(set(hf_sd) - set(back))
    extra = sorted(set(back) - set(hf_sd))
    shapes = sorted(k for k in set(hf_sd) & set(back) if tuple(hf_sd[k].shape) != tuple(back[k].shape))
    diff, note = _roundtrip_values(adapter, tiny_sd, tiny_error)
    ok = not (missing or extra or shapes) and diff == 0.0
    return KeyCheck(
        verdict="PASS" if ok else "FAIL",
        missing=missing[:_LISTED],
        unexpected=extra[:_LISTED],
        shape_mismatch=shapes[:_LISTED],
        max_abs_diff=diff,
        checked_keys=len(hf_sd),
        note=note,
    )


def _roundtrip_values(adapter: Any, tiny_sd: dict[str, Any] | None, tiny_error: str) -> tuple[float | None, str]:
    if tiny_sd is None:
        return None, f"{NO_TINY_TWIN}{f' ({tiny_error})' if tiny_error else ''}"
    back = adapter.titan_to_hf_moe_state_dict(adapter.hf_to_titan_moe_state_dict(tiny_sd))
    common = [k for k in tiny_sd if k in back and tuple(back[k].shape) == tuple(tiny_sd[k].shape)]
    if len(common) != len(tiny_sd):
        return None, f"values not compared on {len(tiny_sd) - len(common)} tiny keys that did not come back"
    diff = max((float((back[k].float() - tiny_sd[k].float()).abs().max()) for k in common if tiny_sd[k].numel()),
               default=0.0)
    return diff, f"values compared on {len(common)} keys of a tiny materialized model"


def check_strict_load(
    adapter: Any, titan_moe: Any, hf_layer_sd: dict[str, Any], *, prefix: str, hf_has_correction_bias: bool,
    placeless: frozenset[str] = frozenset(),
) -> tuple[KeyCheck, list[CompatIssue]]:
    """Load the converted keys under ``prefix`` into ``titan_moe`` (meta) with strict=True.

    ``placeless``: HF keys (relative to the block) Titan's MoE has no place for; each is a core finding's,
    so a strict load they fail is no fixable key-mapping finding."""
    converted = adapter.hf_to_titan_moe_state_dict(hf_layer_sd)
    sub = {k[len(prefix):]: v for k, v in converted.items() if k.startswith(prefix)}
    want = titan_moe.state_dict()
    missing = sorted(set(want) - set(sub))
    unexpected = sorted(set(sub) - set(want))
    differing = {k: (tuple(sub[k].shape), tuple(want[k].shape)) for k in set(sub) & set(want)
                 if tuple(sub[k].shape) != tuple(want[k].shape)}
    shapes = sorted(f"{k}: converted {a} vs titan {b}" for k, (a, b) in differing.items())
    note = ""
    if not hf_has_correction_bias:
        benign = [k for k in missing if k.startswith("expert_bias")]
        missing = [k for k in missing if k not in benign]
        note = (f"ignored {benign}: Titan's load-balancing buffer, zero-initialised, HF has no counterpart"
                if benign else "")
    if not (missing or unexpected or shapes):
        # NOTE: benign Titan-only buffers keep Titan's own value so the load can stay strict.
        titan_moe.load_state_dict({k: sub.get(k, want[k]) for k in want}, strict=True)
    left = sorted(k for k in unexpected if k in placeless)
    if left:
        note = "; ".join(filter(None, [note, f"{left}: no place in Titan's MoE (core findings)"]))
    check = KeyCheck(
        verdict="FAIL" if missing or unexpected or shapes else "PASS",
        missing=missing, unexpected=unexpected, shape_mismatch=shapes, checked_keys=len(want), note=note,
    )
    counts = {k: (a[0], b[0]) for k, (a, b) in differing.items() if len(a) == len(b) and a[1:] == b[1:]}
    return check, classify_strict_load(check, prefix=prefix, placeless=placeless,
                                       row_counts=counts if len(counts) == len(differing) else {})


def classify_strict_load(check: KeyCheck, *, prefix: str, placeless: frozenset[str] = frozenset(),
                         row_counts: dict[str, tuple[int, int]] | None = None) -> list[CompatIssue]:
    """Name the cause of each strict-load failure: misnamed bias, transposed experts, a different expert
    count, others (keys with no place in Titan's MoE are the core findings', not a mapping to fix).

    ``row_counts``: key -> (converted, Titan) leading size, given when every shape differs in that size only."""
    issues: list[CompatIssue] = [_expert_count_differs(row_counts, prefix)] if row_counts else []
    missing, unexpected = list(check.missing), [k for k in check.unexpected if k not in placeless]
    titan_bias = [k for k in missing if k.startswith("expert_bias")]
    hf_bias = [k for k in unexpected if k.startswith("expert_bias")]
    if titan_bias and hf_bias:
        issues.append(
            CompatIssue(
                code="router_bias_key_misnamed",
                message=(
                    f"the adapter maps gate.e_score_correction_bias to {prefix}{hf_bias[0]} but the Titan MoE "
                    f"stores it as {prefix}{titan_bias[0]}; a strict load fails and a non-strict one silently "
                    "drops the sigmoid router's correction bias (the round trip cannot see this)"
                ),
                fix_location=f"{STATE_DICT_ADAPTER} (_build_hf_to_titan_patterns and _build_titan_to_hf_patterns: "
                             "use the GroupedExperts-style discovered buffer name)",
                severity="fixable",
            )
        )
        missing = [k for k in missing if k not in titan_bias]
        unexpected = [k for k in unexpected if k not in hf_bias]
    if check.shape_mismatch and not row_counts:
        issues.append(
            CompatIssue(
                code="strict_load_shape_mismatch",
                message=f"converted expert weights do not fit the Titan MoE: {check.shape_mismatch[:4]} "
                        "(transposed layout?)",
                fix_location=f"{STATE_DICT_ADAPTER} (hf_to_titan_moe_state_dict: transpose/split)",
                severity="fixable",
            )
        )
    if missing or unexpected:
        issues.append(
            CompatIssue(
                code="state_dict_keys_unmapped",
                message=f"strict load of {prefix}*: Titan keys with no converted source {missing[:6]}; "
                        f"converted keys Titan does not have {unexpected[:6]}",
                fix_location=f"{STATE_DICT_ADAPTER} (_build_hf_to_titan_patterns / _build_titan_to_hf_patterns)",
                severity="fixable",
            )
        )
    return issues


def _expert_count_differs(row_counts: dict[str, tuple[int, int]], prefix: str) -> CompatIssue:
    listed = ", ".join(f"{prefix}{k}: {hf} vs {titan}" for k, (hf, titan) in sorted(row_counts.items())[:4])
    return CompatIssue(
        code="expert_count_differs",
        message=(
            f"the converted weights route over a different number of experts than the Titan MoE the target builds "
            f"holds ({listed}); no transpose or key mapping fits them. HF's router may score experts that compute "
            "nothing (zero-computation experts: config zero_expert_num), which Titan's MoE has no place for"
        ),
        fix_location="torchtitan/models/common/moe.py (MoE, TokenChoiceTopKRouter), outside the experiment folder "
                     "(a person decides)",
        severity="core",
    )


def roundtrip_issues(check: KeyCheck) -> list[CompatIssue]:
    """Turn a failed round trip into an issue.

    Keys and shapes that all come back while no value could be compared are no fault of the target's
    adapter: the tiny twin is this workflow's own scaled config, which no edit of the target can build.
    """
    if check.verdict == "PASS":
        return []
    if check.note.startswith(NO_TINY_TWIN) and not (check.missing or check.unexpected or check.shape_mismatch):
        return [
            CompatIssue(
                code="roundtrip_values_unchecked",
                message=(
                    f"HF -> Titan -> HF keeps all {check.checked_keys} keys and their shapes at real size, but no "
                    f"value was compared: {check.note.removeprefix('values not compared: ')}; the round trip "
                    "stays unproven (FAIL). The tiny twin's config is scaled by this workflow, not by the target, "
                    "so no edit of the experiment folder changes it"
                ),
                fix_location=f"{SCALED_CONFIG} (build_scaled_kwargs: a tiny config the model's class accepts), "
                             "outside the target; or a person waives the round trip",
                severity="blocker",
            )
        ]
    return [
        CompatIssue(
            code="roundtrip_failed",
            message=(
                f"HF -> Titan -> HF changed the state dict: missing {check.missing[:4]}, extra {check.unexpected[:4]}, "
                f"shape changes {check.shape_mismatch[:4]}, max |diff| {check.max_abs_diff} ({check.note})"
            ),
            fix_location=f"{STATE_DICT_ADAPTER} (_build_titan_to_hf_patterns)",
            severity="fixable",
        )
    ]
