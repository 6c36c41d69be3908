"""Keys the numerics worker's ``load_state_dict`` dropped: a finding that names whose fix it is.

The worker loads the adapter's converted keys into Titan's MoE with ``strict=False`` so that the
comparison still runs. A dropped key means the comparison did not load what the adapter produces, so
the verdict is not the adapter's. Who must fix it follows from evidence:

- ``load.ours``: keys the target's own build of the MoE has (as the probe's strict load builds it) and
  our worker's build lacked: our worker's fault, the phase fails as an error of ours;
- keys whose name a core or blocker finding of the probe quotes (Titan has no place for them, the
  probe said why, and a person let the run go on): a person's call;
- any other key: the experiment folder's ``state_dict_adapter.py``.

Every message quotes the probe's strict-load verdict beside its own, so the two never contradict.
"""

from __future__ import annotations

from typing import Any

from orchestrator.phase_api import Issue
from phases.add_moe_model.compat import CompatIssue
from phases.add_moe_model.records import Probe

WORKER_FIX = ("phases/add_moe_model/work/moe_blocks.py (probe_moe_params: the load-balance coefficient rule; "
              "convert_site_state_dict: the keys the adapter sees), the workflow's numerics worker")
ADAPTER_FIX = "state_dict_adapter.py (_build_hf_to_titan_patterns / _build_titan_to_hf_patterns)"


def check_load(r: Any, *, probe: Probe | None) -> list[Issue]:
    """The findings for one verdict row's dropped keys (empty when everything loaded)."""
    ours = [k for k in r.load.unexpected if k in r.load.ours]
    rest = [k for k in r.load.unexpected if k not in ours]
    core = core_findings(rest, probe)
    placeless = sorted({k for _, keys in core for k in keys})
    adapter = [k for k in rest if k not in placeless]
    said = probe_said(probe)
    issues = []
    if ours:
        issues.append(Issue(code="numerics_worker_dropped_keys", fix_location=WORKER_FIX, message=(
            f"{r.model_type}: our numerics worker built Titan's MoE without {ours}, which the adapter produced and "
            f"the target's own MoE has (built as the probe builds it; {said}); load_state_dict dropped them and the "
            "comparison ran without them. Our worker's fault, not the experiment folder's")))
    if placeless:
        issues.append(placeless_issue(r.model_type, placeless, core, said=said))
    if adapter or r.load.missing:
        issues.append(Issue(code="adapter_keys_dropped", fix_location=ADAPTER_FIX, message=(
            f"{r.model_type}: load_state_dict dropped the adapter's keys {adapter} (Titan's MoE has no such keys, "
            f"checked against the target's own build) and found no converted source for Titan's {r.load.missing}: "
            f"the comparison did not load what the adapter converts. {agreement(said)}")))
    return issues


def placeless_issue(model_type: str, keys: list[str], core: list[tuple[CompatIssue, list[str]]], *,
                    said: str) -> Issue:
    codes = ", ".join(issue.code for issue, _ in core)
    fixes = "; ".join(issue.fix_location for issue, _ in core)
    return Issue(code="titan_lacks_converted_keys", message=(
        f"{model_type}: Titan's MoE has no place for HF's {keys}; the probe found why ({codes}: outside the "
        f"experiment folder) and a person let the run go on, so the verdict measures Titan without them ({said})"),
        fix_location=f"{fixes}; a person decides: `orchestrator resume RUN --waive titan_lacks_converted_keys "
                     "--reason TEXT`, or abort")


def core_findings(keys: list[str], probe: Probe | None) -> list[tuple[CompatIssue, list[str]]]:
    """Each probe core/blocker finding with the dropped keys whose last name it quotes (e.g. 'scale')."""
    found = []
    for issue in probe.issues if probe else ():
        if issue.severity not in ("core", "blocker"):
            continue
        named = [k for k in keys if f"'{k.rsplit('.', 1)[-1]}'" in issue.message]
        if named:
            found.append((issue, named))
    return found


def probe_said(probe: Probe | None) -> str:
    """"probe: strict load PASS" or "probe: strict load FAIL (unexpected [...], missing [...])"."""
    if probe is None or probe.strict_load is None:
        return "no probe result to compare with"
    if probe.strict_load == "PASS":
        return "probe: strict load PASS"
    detail = probe.strict_load_detail
    return (f"probe: strict load {probe.strict_load} (unexpected {detail.unexpected if detail else []}, "
            f"missing {detail.missing if detail else []})")


def agreement(said: str) -> str:
    """How this finding stands beside the probe's strict load."""
    if said.endswith("PASS"):
        return ("The probe's strict load PASSed on the real model's layer at real size; on the synthetic model the "
                "same adapter's keys do not fit (a pattern tied to the real model's sizes or layer indices?)")
    return f"The probe found the same kind of failure ({said})"
