"""The skill's own numerics script in the target tree, beside the built-in comparison (no torch).

Where the target ships ``numerical_equivalence.py`` (NE) the skill's Phase 3 is to run it for
the model. The numerics phase does that (``work/tree_script.py``), keeps the output verbatim,
parses the script's verdict from its own output lines and states which verdict stands:

- the script gave no verdict (not shipped, an ERROR line, a crash): the built-in one stands and
  the script's failure is a finding with its cause where the evidence shows it (the shapes the
  script fed the Titan MoE against the layout that MoE's code takes);
- both gave a tier: the same tier -> the built-in stands (same comparison, with provenance);
  different tiers -> the stricter stands until someone explains the difference.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from pydantic import BaseModel, Field

from orchestrator.errors import WorkerFailed
from orchestrator.phase_api import PhaseResult
from phases.add_moe_model.compat import EXP
from phases.add_moe_model.workers import SEED, TREE_NUMERICS

NE_PATH = f"{EXP}/.claude/skills/add_moe_model/scripts/numerical_equivalence.py"
TIERS = ("PASS", "WARN", "FAIL")
_LINE = re.compile(r"^\s+(PASS|WARN|FAIL|SKIP|ERROR)\s+(\S+)\s+(.*)$")
_METRIC = re.compile(r"(KL|cos|max_diff)=([-+0-9.eE]+|nan|inf)")
_ROUNDTRIP_HEADER = "State dict adapter round-trip test"


class TreeScriptVerdict(BaseModel):
    """The tree script's result for one model, parsed from its own output."""

    shipped: bool
    command: str = ""
    returncode: int | None = None
    status: str = "NOT_SHIPPED"
    """PASS / WARN / FAIL / SKIP / ERROR as the script printed it, NO_VERDICT when no line names the model."""
    detail: str = ""
    kl: float | None = None
    cos_sim: float | None = None
    max_diff: float | None = None
    roundtrip: str | None = None
    roundtrip_detail: str = ""
    moe_inputs: list[dict[str, Any]] = Field(default_factory=list)
    finding: str | None = None


def parse_output(output: str, model_type: str) -> dict[str, Any]:
    """Status, detail and metrics of ``model_type`` in both of the script's sections."""
    numerics, roundtrip, in_roundtrip = None, None, False
    for line in output.splitlines():
        if line.strip() == _ROUNDTRIP_HEADER:
            in_roundtrip = True
        match = _LINE.match(line)
        if not match or match.group(2) != model_type:
            continue
        if in_roundtrip:
            roundtrip = roundtrip or match
        else:
            numerics = numerics or match
    parsed: dict[str, Any] = {"status": "NO_VERDICT"}
    if numerics:
        parsed.update(status=numerics.group(1), detail=numerics.group(3).strip())
        metrics = dict(_METRIC.findall(numerics.group(3)))
        parsed.update({key: float(metrics[name]) for name, key in (("KL", "kl"), ("cos", "cos_sim"),
                                                                   ("max_diff", "max_diff")) if name in metrics})
    if roundtrip:
        parsed.update(roundtrip=roundtrip.group(1), roundtrip_detail=roundtrip.group(3).strip())
    return parsed


def build_verdict(answer: dict[str, Any], *, model_type: str, our_layout: str) -> TreeScriptVerdict:
    verdict = TreeScriptVerdict(shipped=True, command=" ".join(answer["argv"]), returncode=answer["returncode"],
                                moe_inputs=answer["moe_inputs"], **parse_output(answer["output"], model_type))
    if verdict.status not in TIERS:
        verdict.finding = explain_failure(verdict, our_layout=our_layout)
    return verdict


def explain_failure(verdict: TreeScriptVerdict, *, our_layout: str) -> str:
    """Why the script gave no verdict, from what was observed (never guessed)."""
    script = verdict.command.split()[1].rsplit("/", 1)[-1] if verdict.command.count(" ") else NE_PATH.rsplit("/", 1)[-1]
    said = f"the tree's {script} printed {verdict.status} for this model"
    said += f" ({verdict.detail})" if verdict.detail else " (no line for it)"
    fed = [shape for rec in verdict.moe_inputs for shape in rec["input_shapes"][:1]]
    layout = our_layout.partition(":")[0]
    dims = {"BLD": 3, "TD": 2}.get(layout)
    if fed and dims and any(len(shape) != dims for shape in fed):
        return (f"{said}: it feeds the Titan MoE input of shape {fed[0]}, but the target's MoE takes "
                f"x_{layout} ({dims}-D) per {our_layout.partition(': ')[2]}; the script was not updated "
                "for this tree's MoE layout (the skill allows no edit of it beyond _MODEL_CONFIGS)")
    if not fed and verdict.status == "ERROR":
        return f"{said} before its Titan MoE ran; the cause is in the script's output above"
    return f"{said}; the Titan MoE received {fed or 'nothing'} (layout {our_layout or 'not determined'})"


def standing(ours: dict[str, Any], script: TreeScriptVerdict) -> dict[str, str]:
    """Which verdict stands ("builtin" or "tree_script") and why."""
    if not script.shipped:
        return {"stands": "builtin", "why": "the target ships no numerical_equivalence.py"}
    if script.status not in TIERS:
        return {"stands": "builtin", "why": f"the tree's script gave no verdict ({script.status}; the finding "
                                            "says why)"}
    if ours.get("status") not in TIERS:
        return {"stands": "tree_script", "why": f"the built-in comparison ended {ours.get('status')}: "
                                                f"{ours.get('error')}; the script's {script.status} stands"}
    pair = f"tree script {script.status} KL={script.kl}, built-in {ours['status']} KL={ours['kl']:.2e}"
    if script.status == ours["status"]:
        return {"stands": "builtin", "why": f"both say {script.status} ({pair}); the same comparison, "
                                            "the built-in one carries device, versions and seed"}
    stricter = "tree_script" if TIERS.index(script.status) > TIERS.index(ours["status"]) else "builtin"
    return {"stands": stricter, "why": f"the tiers differ ({pair}); the stricter stands until the "
                                       "difference is explained"}


def run_tree_script(ctx: Any, *, model_type: str, our_layout: str) -> TreeScriptVerdict:
    """Run NE for ``model_type`` when the target ships it; write its verbatim output as an artifact."""
    if not (ctx.target / NE_PATH).is_file():
        return TreeScriptVerdict(shipped=False)
    ctx.progress(f"running the tree's own {NE_PATH.rsplit('/', 1)[-1]} for {model_type}")
    request = {"script": NE_PATH, "model_type": model_type, "device": ctx.options.get("device", "auto"),
               "seed": SEED}
    try:
        answer = ctx.call(TREE_NUMERICS, request, label="tree_numerics").model_dump()
    except WorkerFailed as exc:
        return TreeScriptVerdict(shipped=True, status="NO_VERDICT", finding=f"the worker running the tree's "
                                 f"script did not answer: {exc} (log {ctx.last_worker_log})")
    ctx.write_artifact("tree_script_numerics.txt", f"$ {' '.join(answer['argv'])}\n{answer['output']}"
                                                   f"[exit {answer['returncode']}]\n")
    return build_verdict(answer, model_type=model_type, our_layout=our_layout)


def attach(ctx: Any, result: PhaseResult) -> PhaseResult:
    """Add the tree script's verdict and the standing decision to the numerics phase's result.

    The route follows the standing verdict: a stricter tree-script WARN/FAIL sends a built-in
    PASS to the gap analysis. An ERROR of the built-in comparison keeps its triage either way.
    """
    ours = result.data.get("verdict") or {}
    script = run_tree_script(ctx, model_type=ours.get("model_type", ""), our_layout=ours.get("moe_layout", ""))
    stand = standing(ours, script)
    ctx.add_record("tree_script_verdict", {**script.model_dump(exclude={"moe_inputs"}), **stand})
    if script.finding:
        ctx.note(script.finding, kind="finding")
    if script.shipped:
        ctx.note(f"numerics verdict: {stand['stands']} stands: {stand['why']}", kind="decision")
    route = result.route
    if stand["stands"] == "tree_script" and result.outcome == "passed" and script.status != "PASS":
        route = "gap"
    if script.shipped:
        ctx.write_artifact("numerics_verdicts.txt", side_by_side(ours, script, stand))
    summary = result.summary + (f"; tree script {script.status}, {stand['stands']} verdict stands"
                                if script.shipped else "")
    data = {**result.data, "tree_script": script.model_dump(), "verdict_standing": stand}
    return dataclasses.replace(result, summary=summary, data=data, route=route)


def side_by_side(ours: dict[str, Any], script: TreeScriptVerdict, stand: dict[str, str]) -> str:
    def metrics(kl: Any, cos: Any, diff: Any) -> str:
        shown = {"KL": f"{kl:.2e}" if isinstance(kl, float) else kl, "cos": f"{cos:.6f}" if isinstance(cos, float)
                 else cos, "max_diff": f"{diff:.2e}" if isinstance(diff, float) else diff}
        return "  ".join(f"{name}={value}" for name, value in shown.items())

    ours_roundtrip = (ours.get("roundtrip") or {}).get("status")
    return (f"built-in comparison ({ours.get('dtype')}, {ours.get('device')}): {ours.get('status')}  "
            f"{metrics(ours.get('kl'), ours.get('cos_sim'), ours.get('max_diff'))}"
            + (f"  round-trip {ours_roundtrip}" if ours_roundtrip else "") + "\n"
            f"tree script ({script.command}): {script.status}  {metrics(script.kl, script.cos_sim, script.max_diff)}"
            + (f"  round-trip {script.roundtrip}" if script.roundtrip else "") + "\n"
            f"stands: {stand['stands']}: {stand['why']}\n"
            + (f"finding: {script.finding}\n" if script.finding else ""))
