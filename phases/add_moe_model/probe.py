"""Phase 1 of add_moe_model: the compatibility probe (engine side, no torch).

The work runs in ``work.probe:probe`` in a subprocess of the target checkout; this module
resolves MODEL, writes compat_report.json / compat_report.txt, and maps the report onto
the phase outcome: no issues -> passed; only fixable issues -> needs_agent (fix under the
experiment folder, then the next advance re-probes the edited checkout); any blocker
(nn.ModuleList experts) or core issue (a fix outside the experiment folder) -> needs_human.
"""

from __future__ import annotations

import dataclasses

from orchestrator.phase_api import Issue, PhaseContext, PhaseResult, Question
from phases.add_moe_model.compat import CompatReport, ProbeRequest
from phases.add_moe_model.layer_table import kinds_summary
from phases.add_moe_model.model_source import ModelSourceError, resolve_model_source
from phases.add_moe_model.workers import PROBE
from phases.add_moe_model.workspace import EXP

TEMPLATE = "compat_report.txt.j2"
BLOCKER_KEY = "probe_blocker"


def run(ctx: PhaseContext) -> PhaseResult:
    """Probe ctx.options["model"] on ctx.target and report the verdict."""
    try:
        source = resolve_model_source(str(ctx.options.get("model", "")))
    except ModelSourceError as exc:
        return PhaseResult(outcome="failed", summary=str(exc),
                           issues=(Issue(code=exc.code, message=str(exc), fix_location="MODEL option"),))
    ctx.plan(1)
    ctx.progress(f"probing {source.model_id} ({source.kind}) on {ctx.target}")
    response = ctx.call(PROBE, ProbeRequest(source=source), label="probe")
    if response.report is None:
        error = response.error
        return PhaseResult(outcome="failed", summary=error.message,
                           issues=(Issue(code=error.code, message=error.message, fix_location="MODEL option"),))
    report = response.report
    ctx.write_artifact("compat_report.json", report.model_dump_json(indent=2) + "\n")
    ctx.write_artifact("compat_report.txt", ctx.render(TEMPLATE, report=report))
    return map_report(report, answer=ctx.answers.get(BLOCKER_KEY))


def map_report(report: CompatReport, *, answer: str | None = None) -> PhaseResult:
    """Turn a report into the phase outcome (pure: tests call it directly); every summary names the kinds built."""
    result = _map_report(report, answer=answer)
    kinds = kinds_summary(report)
    if not kinds:
        return result
    return dataclasses.replace(result, summary=f"{result.summary}; {kinds}, each built and checked on meta")


def _map_report(report: CompatReport, *, answer: str | None = None) -> PhaseResult:
    data = report.model_dump(mode="json")
    issues = tuple(Issue(code=i.code, message=f"[{i.severity}] {i.message}", fix_location=i.fix_location)
                   for i in report.issues)
    clean = report.state_dict_roundtrip == "PASS" and report.strict_load == "PASS"
    if not report.issues and clean:
        return PhaseResult(outcome="passed", summary=f"{report.model_id}: compatible, no issues", data=data)
    human = [i for i in report.issues if i.severity in ("blocker", "core")]
    fixable = [i for i in report.issues if i.severity == "fixable"]
    if human and answer == "stop":
        return PhaseResult(outcome="failed",
                           summary=f"{report.model_id}: stopped on {len(human)} blocker/core issue(s)",
                           data=data, issues=issues)
    if human and answer != "continue_anyway":
        return PhaseResult(
            outcome="needs_human",
            summary=f"{report.model_id}: {len(human)} issue(s) need a human ({', '.join(i.code for i in human)})",
            data=data,
            issues=issues,
            questions=(_blocker_question(report, human),),
        )
    if fixable:
        codes = ", ".join(i.code for i in fixable)
        return PhaseResult(outcome="needs_agent",
                           summary=f"{report.model_id}: {len(fixable)} fixable issue(s): {codes}",
                           data=data, issues=issues)
    if not clean:
        failed = state_dict_check_failed(report)
        finding = {"code": failed.code, "message": failed.message, "fix_location": failed.fix_location,
                   "severity": "fixable"}
        return PhaseResult(outcome="needs_agent", summary=f"{report.model_id}: state-dict checks failed",
                           data={**data, "issues": [*data["issues"], finding]}, issues=(failed,))
    return PhaseResult(outcome="passed",
                       summary=f"{report.model_id}: continuing past {len(human)} accepted blocker/core issue(s): "
                               f"{', '.join(i.code for i in human)}",
                       data=data, issues=issues)


def state_dict_check_failed(report: CompatReport) -> Issue:
    """A failed round trip or strict load no finding covers, with its own notes and the file a fix changes: the
    target's MoE probe when it built no Titan MoE (no adapter edit loads into nothing), else the adapter."""
    notes = "; ".join(f"{name}: {d.note}" for name, d in (("round trip", report.roundtrip_detail),
                                                          ("strict load", report.strict_load_detail)) if d.note)
    no_moe = (report.strict_load_detail.note or "").startswith("no Titan MoE")
    where = (f"{EXP}moe_replacement.py (_probe_hf_moe_block: return the block's parameters)" if no_moe
             else f"{EXP}state_dict_adapter.py")
    return Issue(code="state_dict_check_failed",
                 message=f"round trip {report.state_dict_roundtrip}, strict load {report.strict_load}"
                         + (f" ({notes})" if notes else ""), fix_location=where)


def render_compat_text(report: CompatReport) -> str:
    """Render the 1g text report exactly as ``ctx.render`` does (for tests and offline use)."""
    from orchestrator.context import render_template

    return render_template("add_moe_model", TEMPLATE, report=report)


def _blocker_question(report: CompatReport, human: list) -> Question:
    lines = "; ".join(f"{i.code} ({i.severity}): fix in {i.fix_location}" for i in human)
    return Question(
        key=BLOCKER_KEY,
        prompt=(
            f"The probe of {report.model_id} found issues the agent may not fix inside the experiment folder: {lines}. "
            "Stop the run, or continue anyway (the issues stay recorded)?"
        ),
        choices=("stop", "continue_anyway"),
        human_only=True,
    )
