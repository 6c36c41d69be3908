"""The local-compile-perf table: phases, routes, gates and rules (see the package docstring)."""

from __future__ import annotations

from typing import Any

from orchestrator.workflow import PhaseSpec, Submission, Workflow
from phases.local_compile_perf.candidates import PICK_PHASE, CandidateArgs
from phases.local_compile_perf.devlog import render_devlog
from phases.local_compile_perf.records import Baselines, Candidate, Plan, TpEpVerdict
from phases.local_compile_perf.results import (CandidateVerdict, Correctness, CorrectnessRecord, GraphBudget,
                                               GraphCount, IdealTimes, PickFix, PrDecision, Rank, RewriteDeltas,
                                               ScreenConfirm, StackCode, StackCodePart, StackEntry)
from phases.local_compile_perf.start import LcpOptions, prepare
from phases.local_compile_perf.rules import RULES

PACKAGE = "phases.local_compile_perf"
BACK = {"rejected": "pick_fix"}


def phase(name: str, **spec: Any) -> PhaseSpec:
    """The table row of phase ``name``: its module is ``phases/local_compile_perf/<name>.py``."""
    return PhaseSpec(name=name, module=f"{PACKAGE}.{name}", **spec)


def candidate_pending(state: dict[str, Any]) -> list[str]:
    picked = WORKFLOW.result_in(state, PICK_PHASE)
    ruled = {v.id for v in WORKFLOW.records_in(state, CandidateVerdict)}
    if picked is None or picked.candidate is None or picked.candidate.id in ruled:
        return ["no candidate under test: submit one (tool submit, kind candidate; "
                "CLI `orchestrator candidate RUN --branch B --label L`)"]
    return []


def baselines_measured(state: dict[str, Any]) -> list[str]:
    baselines = WORKFLOW.result_in(state, "baselines")
    trees = {r.variant for r in (baselines.rows if baselines else ()) if r.status == "measured"}
    missing = {"eager", "per_layer"} - trees
    return [f"baselines lack measured {sorted(missing)} rows"] if missing else []


WORKFLOW = Workflow(
    name="local-compile-perf",
    description="measure glue against ideal time, rank it, verify the agent's rewrites, deliver a stack",
    templates="local_compile_perf",
    phases=(
        phase("plan", title="budget, stop rule, devlog, inventory", returns=Plan,
              agent_notes="The engine detects the region API and refuses a tree without local_compile."),
        phase("baselines", title="traps, then eager / upstream / per-layer", returns=Baselines,
              timeout_s=3600, agent_notes="3+ token counts, both launch modes, median of 3 fresh processes."),
        phase("ideal_times", title="bandwidth and glue-op ideal times",
              gates=("baselines_measured",), returns=IdealTimes),
        phase("profile_diff", title="kernel families and diff"),
        phase("rank", title="(measured - ideal) x share, stop rule", returns=Rank),
        phase("pick_fix", title="wait for the agent's candidate branch",
              routes={"finish": "findings", "rejected": "pick_fix"}, allowed_paths=("examples/", "torchtitan/"),
              returns=PickFix,
              agent_notes="Write the rewrite on a new branch (cheapest fix first: enable, resize, rewrite, "
                          "option, autograd.Function); with the tools: edit_file, then commit_branch, then submit kind "
                          "candidate {branch, label} (CLI: `orchestrator candidate RUN --branch B --label L`). "
                          "Answer candidates=done when the stop rule holds or the budget is spent. Where a rewrite "
                          "cannot reach its ideal time, add a note `blocker: <region>: what blocks it` (the kernel, "
                          "the bytes, the compiler limit): the findings carry it."),
        phase("graph_budget", title="graphs over all shapes + no_grad, TP/EP build check",
              gates=("candidate_pending",), routes=BACK, returns=GraphBudget),
        phase("screen_confirm", title="screen, then 3 fresh processes",
              timeout_s=3600, routes=BACK, returns=ScreenConfirm),
        phase("correctness", title="outputs and grads vs eager and fp64",
              routes=BACK, returns=Correctness),
        phase("commit_scope", title="stack branch, scope, reaching recipes",
              routes={**BACK, "loop": "pick_fix"}),
        phase("findings", title="stack code measured, findings doc, PR texts, ask about PRs", timeout_s=3600),
        phase("feedback", title="feed the skill back"),
    ),
    options=LcpOptions,
    prepare=prepare,
    gates={"candidate_pending": candidate_pending, "baselines_measured": baselines_measured},
    rules=RULES,
    records={"tp_ep_build_check": TpEpVerdict, "candidate_submitted": Candidate, "candidate_verdict": CandidateVerdict,
             "graph_count": GraphCount, "correctness": CorrectnessRecord, "stack_entry": StackEntry,
             "stack_code": StackCode, "stack_code_part": StackCodePart, "rewrite_deltas": RewriteDeltas,
             "pr_decision": PrDecision},
    after_phase=(render_devlog,),
    submissions={"candidate": Submission(phase=PICK_PHASE, args=CandidateArgs, noun="candidates",
                                         check=f"{PACKAGE}.candidates:accept_candidate")},
)
