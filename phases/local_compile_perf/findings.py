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
from phases.local_compile_perf.devlog import log
from phases.local_compile_perf.glue_bar import GLUE_BAR_PCT, judge_glue_bar
from phases.local_compile_perf.pr_lint import lint_pr_text
from phases.local_compile_perf.records import Baselines, Candidate, Plan
from phases.local_compile_perf.results import CandidateVerdict, IdealTimes, PrDecision
from phases.local_compile_perf.rewrite_deltas import measure_rewrite_deltas, rewrite_deltas_left
from phases.local_compile_perf.skill_feedback import collect_feedback
from phases.local_compile_perf.timing_notes import headline_per_step, section_loads
from phases.local_compile_perf.stack import is_ancestor, stack_entries
from phases.local_compile_perf.stack_code import REACHED_RATIO, measure_stack_code, stack_code_calls_left

NOT_TESTED_CUDA = ("best-known kernels beyond Liger-Kernel's RMSNorm, SwiGLU and RoPE: quack and FA4 need "
                   "nvidia-cutlass-dsl's CUDA 13 libraries (a 92 MB wheel) and Transformer Engine builds its PyTorch "
                   "extension from source (no wheel); none is installed on this machine, and the workflow has no "
                   "adapter that calls them",
                   "TP / EP on real ranks: world 8 needs eight GPUs, and multi-GPU FSDP / TP / EP needs torch >= 2.14; "
                   "a fake-process-group build check at world 8 ran instead (shapes, graphs, a zero-token rank; no "
                   "numerics)")
"""What a CUDA run of the workflow cannot show (the H200 this project measures on: one or two GPUs, torch 2.11)."""
NOT_TESTED_HOST = ("CUDA-graph replay, peak device memory and device kernel times: no CUDA device (the profiles are "
                   "host ops timed by self CPU time, the timings a host timer's)",
                   "best-known GPU kernels (Liger-Kernel, quack, FA4, Transformer Engine) and attention's fused "
                   "backends: CUDA only",
                   "TP / EP on real ranks: world 8 needs eight GPUs; a fake-process-group build check at world 8 ran "
                   "instead (shapes, graphs, a zero-token rank; no numerics)")
"""What a run on a host without CUDA cannot show."""


def not_tested(stack_code: dict[str, Any] | None, attention: tuple = (), overrides: tuple = (), *,
               cuda: bool) -> tuple[str, ...]:
    """What this hardware could not show, each with why: the device's fixed list, the target's own fused overrides
    (the plan's inventory), and the attention floor when the eager step made no SDPA call to count; on CUDA also
    why an op's best-known kernel was not timed (off CUDA the fixed list says it for all of them)."""
    unrun = sorted({o["best_known"] for o in (stack_code or {}).get("ops", [])
                    if cuda and o.get("best_known_ms") is None and "runs on CUDA only" in (o.get("best_known") or "")})
    floor = () if attention else ("attention against its FLOP floor: the eager step made no "
                                  "scaled_dot_product_attention call to count",)
    fused = (f"the target's own fused overrides ({', '.join(overrides)}): the workflow has no adapter that calls "
             "them on a region's arguments",) if overrides else ()
    fixed = NOT_TESTED_CUDA if cuda else NOT_TESTED_HOST
    return (*fixed, *fused, *floor, *(f"best-known kernel: {reason}" for reason in unrun))


def side_by_side(stack_code: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The headline rows: main's upstream regions, per-layer compile of main and the stack, from one interleaved
    measurement (the stack_code record), per per-layer token count; empty without a stack."""
    rows = []
    for t in (stack_code or {}).get("per_tokens", []):
        stack, per_layer = t["regions_stack"], t["per_layer_main"]
        rows.append({"tokens": t["tokens"], "upstream": t.get("upstream_main"), "stack": stack,
                     "per_layer": per_layer, "glue_beats_per_layer": bool(stack and per_layer)
                     and stack["glue_ms"] < per_layer["glue_ms"]})
    return rows


def build_summary(ctx: PhaseContext) -> dict[str, Any]:
    """Everything the findings doc and the PR texts cite, from the trail (and the stack code's measurement)."""
    plan, entries = ctx.result("plan", Plan), stack_entries(ctx.state)
    baselines_result = ctx.result("baselines", Baselines)
    baselines = baselines_result.rows
    bandwidth = ctx.result("ideal_times", IdealTimes).bandwidth
    ctx.plan((stack_code_calls_left(ctx, plan, entries[-1]["commit"]) if entries else 0)
             + sum(plan.rewrite_deltas and rewrite_deltas_left(ctx, e) for e in entries))
    stack_code = measure_stack_code(ctx, plan, entries[-1]["commit"], bandwidth.tbs) if entries else None
    deltas = [d for e in entries if plan.rewrite_deltas and (d := measure_rewrite_deltas(ctx, plan, e))]
    per_tokens = side_by_side(stack_code)
    context = [{"tokens": t, **{v: (c.cited if (c := measured(baselines, v, t)) else None)
                                for v in ("eager", "upstream", "per_layer")}} for t in plan.tokens]
    submissions = ctx.records(Candidate)
    order = {c.id: n for n, c in enumerate(submissions)}
    rejected = rejections(ctx.records(CandidateVerdict), submissions)
    limits = [v for v in rejected if v["phase"] == "graph_budget"
              and (v["numbers"].get("limit_hit") or not v["numbers"])]
    linear = all(is_ancestor(ctx.target, e["parent"], e["commit"]) for e in entries)
    return {"run_id": ctx.run_id, "plan": plan, "entries": entries, "per_tokens": per_tokens, "baselines": context,
            "rejected": rejected,
            "limits": limits, "not_tested": not_tested(stack_code, baselines_result.attention,
                                                  tuple(plan.inventory.get("override_kernels") or ()),
                                                  cuda=plan.cuda),
            "attention": baselines_result.attention, "feedback": collect_feedback(ctx), "linear": linear,
            "runs": plan.sizes.runs,
            "bandwidth": bandwidth, "stack_code": stack_code, "reached_ratio": REACHED_RATIO,
            "glue_bar": glue_bar_of(stack_code), "glue_bar_pct": GLUE_BAR_PCT,
            "ops_add_up": ops_add_up(stack_code, entries, cuda=plan.cuda),
            "rewrite_deltas": deltas,
            "headline_per_step": headline_per_step(stack_code, cuda=plan.cuda),
            "section_loads": section_loads(stack_code),
            "asked": {e["branch"]: asked(rejected, e, order, frozenset(x["label"] for x in entries))
                      for e in entries}}


def rejections(verdicts: list[CandidateVerdict], submissions: list[Candidate]) -> list[dict[str, Any]]:
    """The rejected verdicts as the reports cite them, each with the regions its submission named."""
    named = {c.id: list(c.regions) for c in submissions}
    return [{**v.model_dump(mode="json"), "regions": named.get(v.id, [])} for v in verdicts if v.verdict == "rejected"]


def asked(rejected: list[dict[str, Any]], entry: dict[str, Any], order: dict[str, int],
          stacked: frozenset[str] = frozenset()) -> list[str]:
    """A PR's "You may ask" lines: each rejection once; one of the entry's own label is an earlier (or later)
    attempt of this rewrite (``order``: submission id to its place in line); the regions a submission named.
    A rejection labelled like another stack entry (``stacked``: the stack's labels) is left to that entry's PR."""
    lines = []
    for r in rejected:
        if r["label"] != entry["label"] and r["label"] in stacked:
            continue
        named = f" (the submission named regions: {', '.join(r['regions'])})" if r.get("regions") else ""
        ruling = f"rejected at {r['phase']}: {r['reason']}{named}"
        if r["label"] == entry["label"]:
            when = "earlier" if order.get(r["id"], -1) < order.get(entry["candidate"], len(order)) else "later"
            lines.append(f"{when} attempt of this rewrite: {ruling}")
        else:
            lines.append(f"why not {r['label']}? {ruling}")
    return list(dict.fromkeys(lines))


def ops_add_up(stack_code: dict[str, Any] | None, entries: list[dict[str, Any]], *, cuda: bool) -> str:
    """Whether the glue-op table's per-step times fit in the stack's step at that token count, or why not."""
    if not stack_code or not stack_code["ops"]:
        return ""
    tokens, total = stack_code["glue_tokens"], sum(o["measured_ms"] for o in stack_code["ops"])
    walls = [(r["cited"]["wall_ms"], "the findings' cells") for r in stack_code["rows"]
             if r["variant"] == "regions_stack" and r["tokens"] == tokens and r.get("cited", {}).get("wall_ms")]
    last = entries[-1]["judged"] if entries else ()
    walls += [(j["candidate"], "the last stack entry's confirmation") for j in last
              if j["tokens"] == tokens and j["metric"] == "wall_ms"]
    if not walls:
        return f"The ops add up to {total:.3f} ms/step; no wall of the stack at {tokens} tokens to set them against."
    wall, source = walls[0]
    line = f"The ops add up to {total:.3f} ms/step against a stack wall of {wall:.3f} ms at {tokens} tokens ({source})"
    if total <= wall:
        return line + "."
    why = ("each timed alone, an op waits on its own launches" if cuda else
           "each timed alone on a host timer, a call pays its own dispatch and, on a loaded host, the scheduler's "
           "waits, which a full step shares or hides")
    return (f"{line}: they do not add up ({total / wall:.2f}x the wall): {why}; read them as ranks, not as shares "
            "of the step.")


def glue_bar_of(stack_code: dict[str, Any] | None) -> dict[str, Any] | None:
    """The stack's bar (glue_bar.py) from the stack code's interleaved cells and glue-op table."""
    if not stack_code:
        return None
    return judge_glue_bar(stack_code["per_tokens"], stack_code["ops"], glue_tokens=stack_code["glue_tokens"])


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
    ctx.add_record("pr_decision", PrDecision(open_prs=answer, stack=tuple(e["branch"] for e in summary["entries"])))
    log(ctx, f"PR decision recorded: {answer} (the engine opens nothing)", kind="decision")
    return PhaseResult(outcome="passed", summary=f"findings: PR decision {answer}",
                       data={"open_prs": answer, "stack": [e["branch"] for e in summary["entries"]],
                             "per_tokens": summary["per_tokens"]})
