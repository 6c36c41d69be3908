"""Every probe finding labelled fixable is either proven (a reference fix shown to clear it) or listed as not yet
shown (phases/add_moe_model/fixability.py), and the survey and reports say which.

The codes are read from the worker source itself, so a new fixable finding that is in neither list
fails here, not in front of an agent that was promised a fix.
"""

from __future__ import annotations

import ast
from pathlib import Path

from phases.add_moe_model.fixability import NOT_YET_SHOWN, PROVEN

WORK = Path(__file__).resolve().parent.parent / "phases" / "add_moe_model" / "work"


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _fixed_severity_helpers(tree: ast.Module) -> set[str]:
    """Module functions that build a fixable CompatIssue from their ``code`` parameter."""
    helpers = set()
    for func in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        for call in (n for n in ast.walk(func) if isinstance(n, ast.Call)):
            severity, code = _keyword(call, "severity"), _keyword(call, "code")
            if (isinstance(severity, ast.Constant) and severity.value == "fixable" and isinstance(code, ast.Name)
                    and code.id in {a.arg for a in func.args.args}):
                helpers.add(func.name)
    return helpers


def fixable_codes() -> dict[str, str]:
    """code -> the worker module that can raise it as fixable."""
    found: dict[str, str] = {}
    for path in sorted(WORK.glob("*.py")):
        tree = ast.parse(path.read_text())
        helpers = _fixed_severity_helpers(tree)
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            severity, code = _keyword(call, "severity"), _keyword(call, "code")
            if isinstance(severity, ast.Constant) and severity.value == "fixable" and isinstance(code, ast.Constant):
                found[code.value] = path.name
            name = getattr(call.func, "id", None)
            if name in helpers and call.args and isinstance(call.args[0], ast.Constant):
                found[call.args[0].value] = path.name
    return found


def test_the_reader_sees_the_codes_it_must() -> None:
    codes = fixable_codes()
    assert {"moe_attr_not_mlp", "module_without_sharding_config", "router_rule_mismatch"} <= set(codes), codes


def test_every_fixable_code_is_proven_or_listed_as_not_yet_shown() -> None:
    """A new fixable check must come with its reference fix, or say plainly (survey, reports) that none exists."""
    codes = fixable_codes()
    unaccounted = {code: module for code, module in codes.items() if code not in PROVEN and code not in NOT_YET_SHOWN}
    assert not unaccounted, f"fixable findings with no reference-fix test and no entry in NOT_YET_SHOWN: {unaccounted}"
    assert not set(PROVEN) & set(NOT_YET_SHOWN)
    assert set(NOT_YET_SHOWN) <= set(codes), "NOT_YET_SHOWN lists a code no check raises as fixable"


def test_survey_notes_fixability_only_on_probe_findings_labelled_fixable(tmp_path: Path) -> None:
    """A gap-analysis residual asks for a hypothesis patch in core, so no experiment-folder promise is attached."""
    from phases.add_moe_model.survey.outcome import row_from_run

    issues = [{"code": "state_dict_keys_unmapped", "message": "[fixable] strict load ...", "fix_location": "adapter"},
              {"code": "residual_gap_unexplained", "message": "max_diff 3.9e-03 remains", "fix_location": "core"}]
    state = {"run_id": "r", "status": "waiting", "awaiting": "agent", "issues": issues, "pending": [], "results": {}}
    reasons = row_from_run("ernie4_5_moe", "type:ernie4_5_moe", state, tmp_path).reasons
    assert reasons[0].endswith("reference fix tested on " + PROVEN["state_dict_keys_unmapped"] + "]")
    assert "clearable" not in reasons[1] and "not yet shown" not in reasons[1]


def test_the_probe_notes_let_the_agent_escalate_what_no_fix_can_clear() -> None:
    """Blind trial (longcat_flash's zero-computation experts): the probe's notes said "Do not ask" while
    docs/agents.md says to escalate a finding no fix in the allowed paths can clear; the agent met both."""
    from phases.add_moe_model.workflow import NOTES

    docs = (Path(__file__).resolve().parent.parent / "docs" / "agents.md").read_text()
    assert "escalate" in NOTES["probe"] and "Do not ask;" not in NOTES["probe"]
    assert "When no fix inside the allowed paths can clear a finding, `escalate`" in docs
