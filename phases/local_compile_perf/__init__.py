"""local-compile-perf as a workflow: the skill's steps 0-11 as one table.

plan -> baselines -> ideal_times -> profile_diff -> rank -> pick_fix, where the run waits
for the agent's candidate branches (``orchestrator candidate RUN --branch B --label L``).
Each candidate goes graph_budget -> screen_confirm -> correctness -> commit_scope and back
to pick_fix ("rejected" from any of them, "loop" after a commit). Answering
``candidates=done`` leads to findings (asks a human about PRs) and feedback. The engine
measures everything; the agent only writes rewrites.
"""

from __future__ import annotations

import functools
from typing import Any

P = "phases.local_compile_perf."
BACK = {"rejected": "pick_fix"}


def candidate_pending(state: dict[str, Any]) -> list[str]:
    cand = state["results"].get("pick_fix", {}).get("candidate")
    ruled = {v["id"] for v in state["records"].get("candidate_verdict", [])}
    if not cand or cand["id"] in ruled:
        return ["no candidate under test: submit one with `orchestrator candidate RUN --branch B --label L`"]
    return []


def baselines_measured(state: dict[str, Any]) -> list[str]:
    rows = state["results"].get("baselines", {}).get("rows", [])
    trees = {r["variant"] for r in rows if r["status"] == "measured"}
    missing = {"eager", "per_layer"} - trees
    return [f"baselines lack measured {sorted(missing)} rows"] if missing else []


def __getattr__(name: str) -> Any:
    # NOTE: the CLI imports this package for its `candidate` command on every start;
    # building the table imports every phase module (pydantic, GitPython), so it is built
    # on first use of WORKFLOW instead (still once, with every problem reported together).
    if name == "WORKFLOW":
        return build_workflow()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def build_workflow() -> Any:
    """The local-compile-perf table (see the module docstring)."""
    from orchestrator.workflow import PhaseSpec, Workflow
    from phases.local_compile_perf.plan import LcpOptions, prepare
    from phases.local_compile_perf.rules import RULES

    return Workflow(
        name="local-compile-perf",
        description="measure glue against ideal time, rank it, verify the agent's rewrites, deliver a stack",
        phases=(
            PhaseSpec(name="plan", module=P + "plan", title="budget, stop rule, devlog, inventory",
                      agent_notes="The engine detects the region API and refuses a tree without local_compile."),
            PhaseSpec(name="baselines", module=P + "baselines", title="traps, then eager / upstream / per-layer",
                      timeout_s=3600, agent_notes="3+ token counts, both launch modes, median of 3 fresh processes."),
            PhaseSpec(name="ideal_times", module=P + "ideal_times", title="bandwidth and glue-op ideal times",
                      gates=("baselines_measured",)),
            PhaseSpec(name="profile_diff", module=P + "profile_diff", title="kernel families and diff"),
            PhaseSpec(name="rank", module=P + "rank", title="(measured - ideal) x share, stop rule"),
            PhaseSpec(name="pick_fix", module=P + "pick_fix", title="wait for the agent's candidate branch",
                      routes={"finish": "findings", "rejected": "pick_fix"}, allowed_paths=("examples/", "torchtitan/"),
                      agent_notes="Write the rewrite on a new branch (cheapest fix first: enable, resize, rewrite, "
                                  "option, autograd.Function), then `orchestrator candidate RUN --branch B --label L`. "
                                  "Answer candidates=done when the stop rule holds or the budget is spent."),
            PhaseSpec(name="graph_budget", module=P + "graph_budget", title="graphs over all shapes + no_grad",
                      gates=("candidate_pending",), routes=BACK),
            PhaseSpec(name="screen_confirm", module=P + "screen_confirm", title="screen, then 3 fresh processes",
                      timeout_s=3600, routes=BACK),
            PhaseSpec(name="correctness", module=P + "correctness", title="outputs and grads vs eager and fp64",
                      routes=BACK),
            PhaseSpec(name="commit_scope", module=P + "commit_scope", title="stack branch, scope, reaching recipes",
                      routes={**BACK, "loop": "pick_fix"}),
            PhaseSpec(name="findings", module=P + "findings", title="findings doc, PR texts, ask about PRs"),
            PhaseSpec(name="feedback", module=P + "feedback", title="feed the skill back"),
        ),
        options=LcpOptions,
        prepare=prepare,
        gates={"candidate_pending": candidate_pending, "baselines_measured": baselines_measured},
        rules=RULES,
    )
