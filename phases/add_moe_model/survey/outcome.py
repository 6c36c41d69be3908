"""One survey row from one add-moe-model run (engine side, no torch).

Outcomes: ``clean`` (numerics PASS or WARN, parallelism build check PASS), ``needs_agent``
(issue codes and where each fix goes), ``needs_human`` (a core change and why), ``fail``
(numerics FAIL, or a tier whose one-ulp spread reaches FAIL, with what gap analysis found),
``unsupported`` (start refused the model: no MoE layers, not a causal LM), ``error`` (an exception
in our own code).

An exception a worker died of is read from its log (``attribute_traceback``): raised in the
target checkout it is a finding (experiment folder -> agent, elsewhere in torchtitan ->
human); raised in our code, or in transformers where our code called it without handling
it, it is ``error``. Where our code handles a transformers failure (the probe's model build)
the phase fails with a code that makes it a finding for a human.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from phases.add_moe_model import fixability_numerics
from phases.add_moe_model.fixability import clearable_note
from phases.add_moe_model.records import Numerics, Parallelism, Results, diagnostic_result
from phases.add_moe_model.tier_text import tier_text
from phases.add_moe_model.work.error_origin import plumbing_failure
from phases.add_moe_model.workspace import EXP

Outcome = Literal["clean", "needs_agent", "needs_human", "fail", "unsupported", "error"]
OUTCOMES: tuple[str, ...] = ("clean", "needs_agent", "needs_human", "fail", "unsupported", "error")
UNSUPPORTED_CODES = frozenset({"not_moe", "not_causal_lm"})
# A phase that failed with one of these has no verdict to give here: a human supplies what is missing
# (a machine with more memory; a config transformers can build).
HUMAN_CODES = frozenset({"insufficient_memory", "hf_build_failed"})
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)')


class SurveyRow(BaseModel):
    """One model type's verdict; ``numerics`` holds the bf16 verdict and its firmness."""

    model_type: str
    model: str
    outcome: Outcome
    run_id: str | None = None
    reasons: list[str] = Field(default_factory=list)
    numerics: dict[str, Any] | None = None
    seconds: float = 0.0


def row_from_run(model_type: str, model: str, state: dict[str, Any], run_dir: Path, *,
                 warm_root: str | None = None) -> SurveyRow:
    """Classify a run that stopped (done, waiting or failed); ``warm_root`` is the warm worker's checkout."""
    results = Results.model_validate(state.get("results", {}))
    numerics = numerics_summary(results.numerics)
    base = dict(model_type=model_type, model=model, run_id=state["run_id"], numerics=numerics)
    if state["status"] == "done":
        return SurveyRow(**base, **_verdict(results, numerics))
    if waits_only_for_gpu_rows(state, results.parallelism):
        unrun = [r for r in results.parallelism.rows if r.status == "UNRUN"]
        why = "; ".join(sorted({r.error for r in unrun}))
        pending = (f"torchrun rows unrun here ({', '.join(r.config for r in unrun)}: {why}); the run waits for "
                   f"their logs (`orchestrator resume {state['run_id']} --results DIR`) or a human's unrun_rows=accept")
        return SurveyRow(**base, **_verdict(results, numerics, pending=pending))
    if state["status"] == "waiting":
        agent = state.get("awaiting") != "human"
        reasons = [_issue_line(i) + (_promise(i) if agent else "") for i in state.get("issues", [])]
        reasons += [q["prompt"] for q in state.get("pending", [])]
        outcome = "needs_human" if state.get("awaiting") == "human" else "needs_agent"
        return SurveyRow(**base, outcome=outcome, reasons=reasons or [state.get("summary") or ""])
    roots = tuple(r for r in (state["target"], warm_root) if r)
    return SurveyRow(**base, **_failed(state, run_dir, roots))


def _promise(issue: dict[str, Any]) -> str:
    """What an agent-bound finding's fix is shown to be: a probe finding labelled fixable (fixability.py), or a
    numerics / gap-analysis code (fixability_numerics.py: proven, not yet shown, or a ledger patch, not a fix)."""
    if issue["message"].startswith("[fixable]"):
        return clearable_note(issue["code"])
    return fixability_numerics.promise(issue["code"])


def waits_only_for_gpu_rows(state: dict[str, Any], parallelism: Parallelism | None) -> bool:
    """Waiting at parallelism only for torchrun rows this machine cannot run, the build check all PASS."""
    keys = {q["key"] for q in state.get("pending", [])}
    build = parallelism.build_check if parallelism else ()
    return (state["status"] == "waiting" and state.get("phase") == "parallelism" and keys == {"unrun_rows"}
            and bool(build) and all(r.status == "PASS" for r in build))


def _verdict(results: Results, numerics: dict[str, Any] | None, *, pending: str = "") -> dict[str, Any]:
    """The row of a run whose every check that can run here has run (done, or waiting for GPU rows)."""
    if numerics and numerics.get("tier") == "FAIL":
        gap = results.gap_analysis.rows if results.gap_analysis else ()
        found = [f"gap analysis: {r.label} -> max_diff {r.max_diff:.2e} ({r.description})"
                 for r in gap if r.max_diff is not None and math.isfinite(r.max_diff)]
        spread = f" (one-ulp spread {numerics['spread']:.2e})" if numerics.get("spread") is not None else ""
        return {"outcome": "fail", "reasons": [f"numerics {numerics['tier_shown']} KL={numerics['kl']:.2e}{spread}",
                                               *found, *([pending] if pending else [])]}
    build = results.parallelism.build_check if results.parallelism else ()
    line = (f"numerics {numerics['tier_shown'] if numerics else '?'}; parallelism build check "
            f"{sum(r.status == 'PASS' for r in build)}/{len(build)} PASS")
    return {"outcome": "clean", "reasons": [line, *([pending] if pending else [])]}


def _failed(state: dict[str, Any], run_dir: Path, roots: tuple[str, ...]) -> dict[str, Any]:
    completed = last_failed_phase(run_dir)
    summary = state.get("summary") or "run failed"
    data = (completed or {}).get("data", {})
    codes = {data.get("code"), *(i["code"] for i in (completed or {}).get("issues", []))}
    if codes & HUMAN_CODES:
        return {"outcome": "needs_human", "reasons": [summary]}
    log = data.get("log")
    if not log:
        return {"outcome": "error", "reasons": [summary]}
    text = (run_dir / "artifacts" / log).read_text(errors="replace")
    return attribute_traceback(text, roots=roots, summary=summary, log=log)


def last_failed_phase(run_dir: Path) -> dict[str, Any] | None:
    for line in reversed((run_dir / "events.jsonl").read_text().splitlines()):
        event = json.loads(line)
        if event["type"] == "phase_completed":
            return event["data"] if event["data"]["outcome"] == "failed" else None
    return None


def attribute_traceback(text: str, *, roots: tuple[str, ...], summary: str, log: str) -> dict[str, Any]:
    """Who raised: the innermost frame that is the target's, transformers' or ours (torch and the
    standard library are skipped). Target: a finding for the agent (experiment folder) or a human
    (core); transformers: a finding for a human (outside torchtitan); ours: ``error``."""
    frames, error = parse_last_traceback(text)
    killed = re.search(r"^FAILED \S+ status=(\w+) returncode=(-?\d+)", text, re.M)
    if not frames and killed and (killed[1] == "timeout" or int(killed[2]) < 0):
        return {"outcome": "needs_human", "reasons": [
            f"the worker was stopped from outside ({killed[1]}, exit {killed[2]}: a timeout, or the kernel's OOM "
            f"killer): no verdict on this machine; run it on a bigger one (log artifacts/{log})"]}
    owned = [(f, n, _owner(f, roots)) for f, n in frames if _owner(f, roots) != "library"]
    if not owned or owned[-1][2] == "ours" or plumbing_failure(error):
        at = f" at {_short(owned[-1][0], roots)}:{owned[-1][1]}" if owned else ""
        return {"outcome": "error", "reasons": [f"{error or summary}{at} (our code; log artifacts/{log})"]}
    file, line, owner = owned[-1]
    if owner == "transformers":  # who called transformers decides: the target's code, or ours (unhandled)
        caller = next(((f, n) for f, n, o in reversed(owned) if o != "transformers"), None)
        raised = f"raised in transformers' {file.split('/transformers/', 1)[-1]}:{line}"
        if not caller or _owner(caller[0], roots) == "ours":
            at = f"{_short(caller[0], roots)}:{caller[1]}" if caller else "?"
            return {"outcome": "error", "reasons": [f"{error} {raised}, uncaught where {at} called it "
                                                    f"(our code; log artifacts/{log})"]}
        error, (file, line) = f"{error} ({raised})", caller
    where = (file, line)
    rel = _short(where[0], roots)
    if rel.startswith(EXP):
        return {"outcome": "needs_agent", "reasons": [
            f"{error} raised in the target's {rel}:{where[1]}: fix in the experiment folder (agent)"]}
    return {"outcome": "needs_human", "reasons": [
        f"{error} raised in the target's {rel}:{where[1]}: outside the experiment folder, a core change (human)"]}


def parse_last_traceback(text: str) -> tuple[list[tuple[str, int]], str]:
    """Frames (file, line) and the exception line of the last traceback in ``text``."""
    lines = text.splitlines()
    start = max((i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")),
                default=None)
    if start is None:
        return [], ""
    frames, error = [], ""
    for line in lines[start + 1:]:
        match = _FRAME.match(line)
        if match:
            frames.append((match[1], int(match[2])))
        elif line and not line.startswith(" "):
            error = line.strip()
            break
    return frames, error


def _owner(file: str, roots: tuple[str, ...]) -> str:
    from orchestrator.worker import PROJECT_ROOT

    if any(file.startswith(root.rstrip("/") + "/") for root in roots):
        return "target"
    if "/site-packages/transformers/" in file:
        return "transformers"
    if file.startswith(PROJECT_ROOT.rstrip("/") + "/") and "/site-packages/" not in file:
        return "ours"
    return "library"


def _short(file: str, roots: tuple[str, ...]) -> str:
    from orchestrator.worker import PROJECT_ROOT

    for root in (*roots, PROJECT_ROOT):
        if file.startswith(root.rstrip("/") + "/"):
            return file[len(root.rstrip("/")) + 1:]
    return file


def _issue_line(issue: dict[str, Any]) -> str:
    where = f" -> fix in {issue['fix_location']}" if issue.get("fix_location") else ""
    return f"{issue['code']}: {issue['message']}{where}"


def numerics_summary(numerics: Numerics | None) -> dict[str, Any] | None:
    """The bf16 verdict with its firmness, and the fp32 diagnostic's KL, from the numerics phase."""
    if numerics is None:
        return None
    verdict = numerics.verdict
    fp32 = diagnostic_result(numerics)
    firm = verdict.firmness or {}
    tier = verdict.status
    return {"tier": tier, "tier_shown": tier_text(tier, firm), "kl": verdict.kl,
            "kl_fp64": firm.get("kl_fp64"), "spread": firm.get("spread"), "cos_sim": verdict.cos_sim,
            "max_diff": verdict.max_diff, "fp32_kl": fp32.kl if fp32 else None, "error": verdict.error,
            "other_kernel": firm.get("other_kernel"), "kl_other_kernel": firm.get("kl_other_kernel")}
