"""Step 8's TP/EP build check, engine side: the candidate at world 8, and the stack where the candidate fails.

The skill: multi-GPU only for what one GPU cannot show (TP/EP behaviour, zero-token ranks), and first
a build check of the harness at the target world size with meta tensors or a fake process group.
The plan records no TP or EP degree, so the check takes DeepSeek-V3's: TP8 and EP8 on 8 ranks. The
worker (``work/tp_ep_check``) builds the embedded layer with the candidate's regions on a fake process
group and records shapes per rank, graphs per region and a zero-token rank; the fake backend moves no
data, so none of it is a numeric result.

Ruling. The skill makes a failure here a finding for the agent, and a candidate that breaks at world
8 cannot be committed, so these reject the candidate: a parameter whose local shape is not its global
one split by the degree, a crash on a rank, or graphs over the headroom target, when the stack's tip
passes the same item (the stack is checked only after the candidate failed one). These are recorded and
shown without a rejection: the zero-token rank's recompile within the budget (one more graph and cold
compile the first time a rank gets no token; the stack is not checked for it, since it never blocks), a
failure the stack has too (the stack's finding), and a check that could not run (UNRUN, with the reason).
A job on real ranks is not submitted here.
"""

from __future__ import annotations

from typing import Any

from orchestrator.errors import WorkerFailed
from orchestrator.phase_api import PhaseContext
from phases.local_compile_perf.candidates import in_checkout
from phases.local_compile_perf.records import Candidate, ParallelBuildCheck, Plan, TpEpVerdict
from phases.local_compile_perf.resume import call_kept
from phases.local_compile_perf.work.tp_ep_check import ParallelCheckRequest
from phases.local_compile_perf.workers import TP_EP

WORLD_SIZE, TP, EP = 8, 8, 8
"""DeepSeek-V3's target layout (the plan has no degree of its own)."""
NEVER_BLOCKS = ("zero_token_graphs",)


def check_call(plan: Plan, checkout: str, regions: list[str] | tuple[str, ...]) -> tuple[Any, Any] | None:
    """The (worker, request) of the build check of ``checkout`` with ``regions``; None where it cannot run."""
    if plan.kind != "embedded":
        return None
    request = ParallelCheckRequest(harness=plan.harness, device="cpu", regions=tuple(regions),
                                   world_size=WORLD_SIZE, tp=TP, ep=EP)
    return in_checkout(checkout, TP_EP, request)


def unrun(plan: Plan, regions: list[str] | tuple[str, ...], reason: str = "") -> ParallelBuildCheck:
    """The check that did not run: for a target it is not written for, or with the worker's last words."""
    why = reason or f"{plan.kind} target: the build check is written for the embedded layer"
    return ParallelBuildCheck(status="UNRUN", reason=why, world_size=WORLD_SIZE, tp=TP, ep=EP, regions=tuple(regions))


def build_check(ctx: PhaseContext, plan: Plan, checkout: str, regions: list[str], label: str) -> ParallelBuildCheck:
    """The worker's check of ``checkout`` with ``regions``; a worker that dies is an UNRUN with its message."""
    call = check_call(plan, checkout, regions)
    if call is None:
        return unrun(plan, regions)
    try:
        return call_kept(ctx, *call, label=label)
    except WorkerFailed as exc:
        return unrun(plan, regions, f"worker failed: {exc.message.splitlines()[-1][:300]}")


def rule(check: ParallelBuildCheck, stack: ParallelBuildCheck | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(blocking items, findings) of the candidate's check against the stack's (None: not checked)."""
    stack_items = stack.items if stack else {}
    blocking, findings = [], []
    for item in check.failed_items:
        why = check.failures.get(item, "")
        if stack_items.get(item) == "FAIL":
            findings.append(f"{item}: the stack fails it too: {why}")
        elif item in NEVER_BLOCKS:
            findings.append(f"{item}: {why} (within the graph budget: recorded, not a rejection)")
        else:
            blocking.append(item)
    if check.status == "UNRUN":
        findings.append(f"not run: {check.reason}")
    findings += [f"{item}: not run (an earlier item failed)" for item, s in check.items.items() if s == "UNRUN"]
    return tuple(blocking), tuple(findings)


def check_tp_ep(ctx: PhaseContext, plan: Plan, cand: Candidate, *,
                checked: ParallelBuildCheck | None = None) -> TpEpVerdict:
    """Run the build check on the candidate (unless ``checked`` is its check, run beside the graph count), on the
    stack when the candidate fails an item that can block, and rule."""
    prepared = cand.prepared
    check = checked or build_check(ctx, plan, prepared.candidate_checkout, prepared.tree_regions,
                                   label="TP/EP build check of the candidate")
    stack = None
    # NOTE: an item that never blocks rules the same whether the stack fails it or not; checking the stack
    # for it alone costs a minute of device time (58 s on the H200, bench/results/2026-12-04-h200-lcp)
    if set(check.failed_items) - set(NEVER_BLOCKS):
        stack = build_check(ctx, plan, prepared.stack_checkout, list(prepared.stack_regions),
                            label="TP/EP build check of the stack")
    blocking, findings = rule(check, stack)
    return TpEpVerdict(candidate=cand.id, check=check, stack_items=stack.items if stack else {},
                       blocking=blocking, findings=findings)


def summary(verdict: TpEpVerdict) -> str:
    """One line for the devlog and the rejection: status, items failed, blocking ones."""
    check = verdict.check
    failed = ", ".join(f"{i} ({check.failures.get(i, '')})" for i in check.failed_items) or "none"
    line = f"TP/EP build check at world {check.world_size} (TP{check.tp}/EP{check.ep}, fake process group): " \
           f"{check.status}; failed: {failed}"
    if check.status == "UNRUN":
        line += f"; {check.reason}"
    return line + (f"; blocking: {', '.join(verdict.blocking)}" if verdict.blocking else "")


def brief(tp_ep: TpEpVerdict | None) -> dict[str, Any]:
    """The build check as the graph-budget data and the correctness record carry it (the full check is its own
    record)."""
    if tp_ep is None:
        return {"status": "UNRUN", "reason": "no build check of this candidate in the run"}
    check = tp_ep.check
    return {"status": check.status, "reason": check.reason, "items": check.items, "blocking": list(tp_ep.blocking),
            "findings": list(tp_ep.findings), "world_size": check.world_size, "tp": check.tp, "ep": check.ep}
