"""Step 10, stack and findings doc: FINDINGS.md, one PR text per stack entry, the PR question.

The findings doc follows the skill's skeleton (conditions, upstream -> stack per token
count, baselines, ordered stack with deltas, each rewrite's own delta when an entry holds
several, Rejected / Compile limits hit / Not tested / Skill feedback). Every number in it
is a cited median taken from the trail. Each PR text is rendered from the pr-template
structure and must pass ``lint_pr_text``; a text that does not is a failed phase (the
template is wrong, not the run). The engine never opens a PR: it asks a human
(``open_prs``: no or draft) and records the answer.
"""

from __future__ import annotations

from typing import Any

from orchestrator.phase_api import Issue, PhaseContext, PhaseResult, Question
from phases.local_compile_perf.confirmed import measured
from phases.local_compile_perf.devlog import log, renders_devlog
from phases.local_compile_perf.pr_lint import lint_pr_text
from phases.local_compile_perf.records import Baselines, Cell, Plan
from phases.local_compile_perf.rewrite_deltas import measure_rewrite_deltas
from phases.local_compile_perf.skill_feedback import collect_feedback
from phases.local_compile_perf.stack import is_ancestor, stack_entries
from phases.local_compile_perf.stack_code import REACHED_RATIO, measure_stack_code

NOT_TESTED = ("best-known kernels (overrides, quack, Liger, TE, FA4) were not benchmarked",
              "attention against its FLOP floor", "TP / EP > 1 / PP and zero-token ranks",
              "re-timing under selective activation checkpointing",
              "cold compile with TORCHINDUCTOR_FORCE_DISABLE_CACHES=1")


def build_summary(ctx: PhaseContext) -> dict[str, Any]:
    """Everything the findings doc and the PR texts cite, from the trail (and the stack code's measurement)."""
    plan, entries = ctx.result("plan", Plan), stack_entries(ctx.state)
    baselines = ctx.result("baselines", Baselines).rows
    final_rows = [Cell.model_validate(r) for r in entries[-1]["confirm_rows"]] if entries else []
    bandwidth = ctx.results["ideal_times"]["bandwidth"]
    stack_code = measure_stack_code(ctx, plan, entries[-1]["commit"], bandwidth["tbs"]) if entries else None
    deltas = [d for e in entries if (d := measure_rewrite_deltas(ctx, plan, e))]
    per_tokens = []
    for t in plan.tokens:
        up, final = measured(baselines, "upstream", t), measured(final_rows, "candidate", t)
        eager, per_layer = measured(baselines, "eager", t), measured(baselines, "per_layer", t)
        per_tokens.append({"tokens": t, "upstream": up and up.cited, "stack": final and final.cited,
                           "eager": eager and eager.cited, "per_layer": per_layer and per_layer.cited,
                           "glue_beats_per_layer": bool(final and per_layer) and
                           final.cited["glue_ms"] < per_layer.cited["glue_ms"]})
    rejected = [v for v in ctx.state["records"].get("candidate_verdict", []) if v["verdict"] == "rejected"]
    limits = [v for v in rejected if v["phase"] == "graph_budget"
              and (v["numbers"].get("limit_hit") or not v["numbers"])]
    linear = all(is_ancestor(ctx.target, e["parent"], e["commit"]) for e in entries)
    return {"plan": plan, "entries": entries, "per_tokens": per_tokens, "rejected": rejected, "limits": limits,
            "not_tested": NOT_TESTED, "feedback": collect_feedback(ctx), "linear": linear, "runs": plan.sizes.runs,
            "bandwidth": bandwidth, "stack_code": stack_code, "reached_ratio": REACHED_RATIO,
            "rewrite_deltas": deltas}


@renders_devlog
def run(ctx: PhaseContext) -> PhaseResult:
    summary = build_summary(ctx)
    findings = ctx.render("findings.md.j2", s=summary)
    ctx.write_artifact("FINDINGS.md", findings)
    problems = {}
    for entry in summary["entries"]:
        text = ctx.render("pr.md.j2", s=summary, e=entry, findings=findings)
        ctx.write_artifact(f"pr/{entry['position']:02d}-{entry['branch'].split('/', 1)[1]}.md", text)
        if lint := lint_pr_text(text):
            problems[entry["branch"]] = lint
    if problems:
        return PhaseResult(outcome="failed", summary=f"findings: {len(problems)} PR text(s) break the PR rules",
                           issues=tuple(Issue(code="pr_text_lint", message=f"{b}: {'; '.join(p)}",
                                              fix_location="templates/local_compile_perf/pr.md.j2")
                                        for b, p in problems.items()))
    if not summary["linear"]:
        return PhaseResult(outcome="failed", summary="findings: stack branches are not linear",
                           issues=(Issue(code="stack_not_linear", message="a stack entry does not descend from the "
                                         "previous one", fix_location="stack/* branches"),))
    if "open_prs" not in ctx.answers:
        log(ctx, f"findings written: {len(summary['entries'])} stack entr(ies), {len(summary['rejected'])} rejected; "
                 "asking whether to open PRs", kind="decision")
        return PhaseResult(outcome="needs_human", summary="findings written; open the stack as draft PRs?",
                           data={"stack": [e["branch"] for e in summary["entries"]]},
                           questions=(Question(key="open_prs", choices=("no", "draft"), human_only=True,
                                               prompt="Open the stack as draft PRs (you open them; the engine never "
                                                      "does), or not at all?"),))
    answer = ctx.answers["open_prs"]
    ctx.add_record("pr_decision", {"open_prs": answer, "stack": [e["branch"] for e in summary["entries"]]})
    log(ctx, f"PR decision recorded: {answer} (the engine opens nothing)", kind="decision")
    return PhaseResult(outcome="passed", summary=f"findings: PR decision {answer}",
                       data={"open_prs": answer, "stack": [e["branch"] for e in summary["entries"]],
                             "per_tokens": summary["per_tokens"]})
