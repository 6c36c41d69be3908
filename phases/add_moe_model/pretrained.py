"""Phase 3b beside 3a: the skill's pretrained test when the run was started with ``--weights DIR``.

The numerics phase calls ``attach`` after its synthetic verdict. It compares the checkpoint's
first MoE block with the target's Titan MoE (``work/pretrained.py``) at the skill's pretrained
threshold (PASS below KL 1e-3, no WARN tier) and, where the target ships the skill's own
``numerical_equivalence_pretrained.py`` (torchtitan main), runs that script on the same
directory and keeps its output verbatim beside ours, with which verdict stands and why.

How the pretrained verdict bears on the route: a FAIL makes the gap analysis mandatory (the
skill: FAIL is fixed in integration code); an ERROR goes to the agent with the skill's triage
(to a person when transformers raised it; the phase fails when our own code or plumbing did);
a SKIP (no MoE layer in the checkpoint) is a finding.
Engine side: no torch here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from orchestrator.phase_api import Issue, PhaseContext, PhaseResult
from phases.add_moe_model import tree_scripts
from phases.add_moe_model.compat import EXP
from phases.add_moe_model.error_triage import NOT_THE_AGENTS, OURS, triage_error
from phases.add_moe_model.workers import PRETRAINED, SEED, TREE_PRETRAINED

NEP_PATH = f"{EXP}/.claude/skills/add_moe_model/scripts/numerical_equivalence_pretrained.py"
METRIC_UNITS = {"kl": "nats", "cos_sim": "ratio", "max_diff": "abs", "mean_diff": "abs"}
_SEVERITY = ("passed", "needs_agent", "needs_human", "failed")


def attach(ctx: PhaseContext, result: PhaseResult) -> PhaseResult:
    """Add the pretrained comparison (and the tree's pretrained script) to the numerics result."""
    weights = ctx.options.get("weights")
    if not weights:
        return result
    request = {"weights": weights, "device": ctx.options.get("device", "auto"), "seed": SEED}
    ctx.progress(f"pretrained comparison on {weights}")
    row = ctx.call(PRETRAINED, request, label="pretrained").model_dump()
    ctx.write_artifact("numerics_pretrained.txt", ctx.render("pretrained_table.txt.j2", r=row))
    record_metrics(ctx, row)
    ctx.add_record("pretrained_verdict", row)
    if row["status"] == "SKIP":
        ctx.note(f"pretrained test skipped: {row['model']}: {row['error']}", kind="finding")
    merged = merge(result, row)
    script = run_tree_script(ctx, request, our_layout=row.get("moe_layout", ""))
    if script is None:
        return merged
    stand = tree_scripts.standing(row, script)
    if script.finding:
        ctx.note(script.finding, kind="finding")
    ctx.note(f"pretrained verdict: {stand['stands']} stands: {stand['why']}", kind="decision")
    ctx.write_artifact("pretrained_verdicts.txt", tree_scripts.side_by_side(row, script, stand))
    route = merged.route
    if stand["stands"] == "tree_script" and merged.outcome == "passed" and script.status == "FAIL":
        route = "gap"
    data = {**merged.data, "pretrained_tree_script": script.model_dump(exclude={"moe_inputs"}),
            "pretrained_standing": stand}
    return dataclasses.replace(merged, data=data, route=route,
                               summary=f"{merged.summary}; tree pretrained script {script.status}")


def merge(result: PhaseResult, row: dict[str, Any]) -> PhaseResult:
    """The numerics result with the pretrained row in its data, summary, findings and route."""
    issues = pretrained_issues(row)
    outcome, route = result.outcome, result.route
    if issues:
        outcome = max(outcome, outcome_for(issues[0]), key=_SEVERITY.index)
        route = "pass" if result.outcome == "passed" else route
    elif row["status"] == "FAIL" and outcome == "passed":
        route = "gap"
    return dataclasses.replace(result, outcome=outcome, route=route, issues=result.issues + tuple(issues),
                               summary=f"{result.summary}; {summary_line(row)}",
                               data={**result.data, "pretrained": row})


def outcome_for(issue: Issue) -> str:
    """As for the synthetic comparison: our own failure fails the phase, transformers' waits for a person."""
    code = issue.code.removeprefix("pretrained_")
    return "failed" if code in OURS else "needs_human" if code in NOT_THE_AGENTS else "needs_agent"


def summary_line(row: dict[str, Any]) -> str:
    if row.get("kl") is None:
        return f"pretrained {row['status']} {row['model']}: {row.get('error') or 'no metrics'}"
    return (f"pretrained {row['status']} {row['model']} (bf16, KL < 1e-3 passes) KL={row['kl']:.2e} "
            f"cos={row['cos_sim']:.6f} max_diff={row['max_diff']:.2e}")


def pretrained_issues(row: dict[str, Any]) -> list[Issue]:
    """The skill's failure triage for an ERROR of the pretrained comparison (the synthetic one's, renamed)."""
    if row["status"] != "ERROR":
        return []
    issue = triage_error(row["model"], row.get("error_type") or "", row.get("error") or "",
                         origin=row.get("error_origin"), frame=row.get("error_frame"))
    return [Issue(code=f"pretrained_{issue.code}", message=f"pretrained test on {row['weights']}: {issue.message}",
                  fix_location=issue.fix_location)]


def record_metrics(ctx: PhaseContext, row: dict[str, Any]) -> None:
    provenance = {"device": row["device"], "device_note": row["device_note"], "versions": row["versions"],
                  "seed": row["seed"], "worker": PRETRAINED.ref, "dtype": row["dtype"], "weights": row["weights"],
                  "hf_experts_impl": row["hf_experts_impl"]}
    for metric, unit in METRIC_UNITS.items():
        if row.get(metric) is not None:
            ctx.record_measurement(name=f"pretrained_{metric}", unit=unit, samples=[row[metric]],
                                   provenance=provenance, labels={"model": row["model"], "role": "pretrained",
                                                                  "model_type": row["model_type"]})


def run_tree_script(ctx: PhaseContext, request: dict[str, Any], *, our_layout: str) -> Any:
    """The tree's numerical_equivalence_pretrained.py on the same directory; None where it is not shipped."""
    from orchestrator.errors import WorkerFailed

    if not (ctx.target / NEP_PATH).is_file():
        return None
    name = request["weights"].rstrip("/").rsplit("/", 1)[-1]
    ctx.progress(f"running the tree's own {NEP_PATH.rsplit('/', 1)[-1]} on {name}")
    try:
        answer = ctx.call(TREE_PRETRAINED, {**request, "script": NEP_PATH}, label="tree_pretrained").model_dump()
    except WorkerFailed as exc:
        return tree_scripts.TreeScriptVerdict(shipped=True, status="NO_VERDICT", finding=f"the worker running the "
                                              f"tree's pretrained script did not answer: {exc} "
                                              f"(log {ctx.last_worker_log})")
    ctx.write_artifact("tree_script_pretrained.txt", f"$ {' '.join(answer['argv'])}\n{answer['output']}"
                                                     f"[exit {answer['returncode']}]\n")
    return tree_scripts.build_verdict(answer, model_type=name, our_layout=our_layout)
