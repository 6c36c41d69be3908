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
    assert reasons[1].endswith("[not an experiment-folder fix: a temporary patch through the ledger, reverted before "
                               "the phase passes]"), reasons[1]


def test_survey_says_what_a_numerics_finding_for_the_agent_promises(tmp_path: Path) -> None:
    from phases.add_moe_model.survey.outcome import row_from_run

    issues = [{"code": "adapter_keys_dropped", "message": "load_state_dict dropped ...", "fix_location": "adapter"},
              {"code": "grouped_mm_shape_error", "message": "grouped_mm: bad offs", "fix_location": "shapes"}]
    state = {"run_id": "r", "status": "waiting", "awaiting": "agent", "issues": issues, "pending": [], "results": {}}
    reasons = row_from_run("qwen3_moe", "Qwen/Qwen3-30B-A3B", state, tmp_path).reasons
    assert "clearable in the experiment folder (state_dict_adapter.py" in reasons[0], reasons[0]
    assert reasons[1].endswith("[experiment-folder fix not yet shown by a test]"), reasons[1]
    human = row_from_run("qwen3_moe", "Qwen/Qwen3-30B-A3B", {**state, "awaiting": "human"}, tmp_path).reasons
    assert all("clearable" not in r and "not yet shown" not in r for r in human), human


# --- numerics and gap analysis (phases/add_moe_model/fixability_numerics.py) ---------------------------------

PHASES = Path(__file__).resolve().parent.parent / "phases" / "add_moe_model"
# The modules whose findings each phase returns (the pretrained comparison is part of the numerics phase).
EMITTERS = {"numerics": ("numerics.py", "error_triage.py", "load_findings.py", "pretrained.py"),
            "gap_analysis": ("gap_analysis.py",)}


def _module_strings(tree: ast.Module) -> dict[str, list[str]]:
    """Module-level NAME = "code" and NAME = {key: "code", ...}: the values a ``code=`` may name."""
    found: dict[str, list[str]] = {}
    for node in (n for n in tree.body if isinstance(n, ast.Assign) and len(n.targets) == 1):
        name = getattr(node.targets[0], "id", None)
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            found[name] = [node.value.value]
        elif isinstance(node.value, ast.Dict):
            found[name] = [v.value for v in node.value.values if isinstance(v, ast.Constant)]
    return found


def issue_codes(module: str) -> tuple[set[str], set[str]]:
    """(codes an ``Issue(code=...)`` in ``module`` can carry, f-string prefixes such as 'pretrained_')."""
    tree = ast.parse((PHASES / module).read_text())
    strings, codes, prefixes = _module_strings(tree), set(), set()
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "Issue"):
        code = _keyword(call, "code")
        if isinstance(code, ast.Constant):
            codes.add(code.value)
        elif isinstance(code, ast.Name):
            codes.update(strings[code.id])
        elif isinstance(code, ast.Subscript) and isinstance(code.value, ast.Name):
            codes.update(strings[code.value.id])
        elif isinstance(code, ast.JoinedStr) and isinstance(code.values[0], ast.Constant):
            prefixes.add(code.values[0].value)
        else:
            raise AssertionError(f"{module}: an Issue code this reader cannot resolve: {ast.unparse(code)}")
    return codes, prefixes


def agent_bound_in_source() -> dict[str, set[str]]:
    """Per phase, every code it can emit minus those that fail the phase (OURS) or wait for a person."""
    from phases.add_moe_model.error_triage import NOT_THE_AGENTS, OURS

    triage, _ = issue_codes("error_triage.py")
    bound = {}
    for phase, modules in EMITTERS.items():
        codes: set[str] = set()
        for module in modules:
            found, prefixes = issue_codes(module)
            codes |= found | {prefix + code for prefix in prefixes for code in triage}
        bound[phase] = {c for c in codes if c.removeprefix("pretrained_") not in OURS | NOT_THE_AGENTS}
    return bound


def test_the_numerics_reader_sees_the_codes_it_must() -> None:
    bound = agent_bound_in_source()
    assert {"adapter_keys_dropped", "numerics_error", "pretrained_numerics_error"} <= bound["numerics"], bound
    assert "raised_in_transformers" not in bound["numerics"] and "firmness_error" not in bound["numerics"]
    assert bound["gap_analysis"] == {"residual_gap_unexplained"}


def test_every_agent_bound_numerics_and_gap_code_is_declared_with_its_evidence_or_reason() -> None:
    """A new code the agent would be sent fails here until it has a reference-fix test or a declared reason."""
    from phases.add_moe_model import fixability_numerics as contract

    bound = agent_bound_in_source()
    for phase, codes in bound.items():
        assert contract.AGENT_BOUND[phase] == codes, (
            f"{phase}: agent-bound in source but declared nowhere: {sorted(codes - contract.AGENT_BOUND[phase])}; "
            f"declared but not agent-bound: {sorted(contract.AGENT_BOUND[phase] - codes)}")
    kinds = (set(contract.PROVEN), set(contract.NOT_YET_SHOWN), set(contract.LEDGER_PATCH))
    assert sum(len(k) for k in kinds) == len(set().union(*kinds)), "a code declared twice"


def test_each_proven_numerics_code_names_a_test_that_exists_and_raises_it() -> None:
    from phases.add_moe_model import fixability_numerics as contract

    root = Path(__file__).resolve().parent.parent
    for code, (_, nodeid) in contract.PROVEN.items():
        path, name = nodeid.split("::")
        text = (root / path).read_text()
        assert f"def {name}(" in text, nodeid
        imported = [root / "tests" / f"{m}.py" for m in ("moe_reference_fixes_numerics",) if m in text]
        assert any(f'"{code}"' in p.read_text() for p in [root / path, *imported]), (code, nodeid)


def test_an_error_in_core_waits_for_a_person_and_one_in_the_experiment_folder_names_its_file() -> None:
    """Attribution follows the innermost frame outside torch: transformers, torchtitan core, the experiment folder."""
    from phases.add_moe_model import numerics
    from phases.add_moe_model.error_triage import triage_error
    from phases.add_moe_model.work.numerics import CompareResult, RoundTrip

    # Seen on 0.3.0 with the experiment folder's _build_moe_config giving the dispatcher top_k=1 (the router 2):
    # the frame is core's, the cause the experiment folder's config, so the person is pointed at both.
    seen = ("IndexError: index 36 is out of bounds for dimension 0 with size 32 [at token_dispatcher.py:100 "
            "_local_reorder <- token_dispatcher.py:134 dispatch <- token_dispatcher.py:404 dispatch]")
    core = triage_error("qwen3_moe", "IndexError", seen, origin="target",
                        frame="torchtitan/models/common/token_dispatcher.py:100 _local_reorder")
    assert core.code == "raised_in_torchtitan_core", core
    assert core.fix_location.startswith("torchtitan/models/common/token_dispatcher.py (")
    assert "transformers_modeling_backend/moe_replacement.py (_probe_hf_moe_block, _build_moe_config)" in (
        core.fix_location)
    exp = "torchtitan/experiments/transformers_modeling_backend/moe_replacement.py:233 _probe_hf_moe_block"
    ours = triage_error("qwen3_moe", "KeyError", "KeyError: 8", origin="target", frame=exp)
    assert ours.code == "numerics_error" and ours.fix_location.startswith(exp.split(":")[0])
    hf = triage_error("qwen3_moe", "RuntimeError", "x", origin="transformers", frame="transformers/a.py:1 f")
    assert hf.code == "raised_in_transformers"

    def decided(**fields: object) -> object:
        return numerics.decide([CompareResult(model_type="qwen3_moe", dtype="bfloat16", device="cpu", seed=42,
                                              roundtrip=RoundTrip(status="PASS", max_diff=0.0), **fields)])

    in_core = decided(status="ERROR", error="RuntimeError: bad", error_type="RuntimeError", error_origin="target",
                      error_frame="torchtitan/models/common/moe.py:438 forward")
    assert in_core.outcome == "needs_human", in_core
    skipped = decided(status="SKIP")
    assert skipped.outcome == "needs_human" and "phases/add_moe_model/work/" in skipped.issues[0].fix_location
    assert "experiment" not in skipped.issues[0].fix_location


def test_the_probe_notes_let_the_agent_escalate_what_no_fix_can_clear() -> None:
    """Blind trial (longcat_flash's zero-computation experts): the probe's notes said "Do not ask" while
    docs/agents.md says to escalate a finding no fix in the allowed paths can clear; the agent met both."""
    from phases.add_moe_model.workflow import NOTES

    docs = (Path(__file__).resolve().parent.parent / "docs" / "agents.md").read_text()
    assert "escalate" in NOTES["probe"] and "Do not ask;" not in NOTES["probe"]
    assert "When no fix inside the allowed paths can clear a finding, `escalate`" in docs
