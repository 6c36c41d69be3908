"""Gates, guards and audit rules of add-moe-model, each a small function of the snapshot.

Gates say why a phase may not be entered; guards run at every advance and read git;
rules run in ``orchestrator audit`` over the whole trail.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.git import changed_paths, open_repo
from orchestrator.waivers import waived_codes
from orchestrator.workflow import Violation, load_workflow
from phases.add_moe_model.forbidden import check_files_for_forbidden_calls
from phases.add_moe_model.workspace import EXP

KL_PASS, KL_WARN = 1e-6, 1e-3


def preflight_answered(state: dict[str, Any]) -> list[str]:
    return [f"pre-flight question {k!r} unanswered" for k in ("branch", "commit") if k not in state["answers"]]


def probe_clean(state: dict[str, Any]) -> list[str]:
    report = load_workflow(state["workflow"]).result_in(state, "probe")
    if report is None:
        return ["the probe has not run"]
    waived = waived_codes(state, "probe")
    reasons = []
    roundtrip_waived = {"roundtrip_failed", "roundtrip_values_unchecked", "state_dict_check_failed"} & set(waived)
    if report.state_dict_roundtrip != "PASS" and not roundtrip_waived:
        reasons.append(f"state-dict round trip is {report.state_dict_roundtrip}")
    fixable = [i.code for i in report.issues if i.severity == "fixable" and i.code not in waived]
    if fixable:
        reasons.append(f"fixable probe issues remain: {', '.join(fixable)}")
    return reasons


def no_open_patches(state: dict[str, Any]) -> list[str]:
    return [f"temporary patch {pid} ({p['label']}) is still applied" for pid, p in state["open_patches"].items()]


def _patched_paths(state: dict[str, Any]) -> set[str]:
    return {path for patch in state["open_patches"].values() for path in patch["files"]}


def scope_guard(state: dict[str, Any]) -> Violation | None:
    """Changed paths since the base (committed, staged, unstaged, untracked) lie inside EXP."""
    outside = [p for p in changed_paths(state["target"], state["base"]["commit"])
               if not p.startswith(EXP) and p not in _patched_paths(state)]
    if not outside:
        return None
    return Violation(
        message=f"{len(outside)} path(s) changed outside {EXP}: {', '.join(outside[:8])}; revert them "
                "(permanent edits belong in the experiment folder; a needed core change is escalated to a human)",
        paths=tuple(outside))


def forbidden_calls_guard(state: dict[str, Any]) -> Violation | None:
    repo = open_repo(state["target"])
    diff = repo.git.diff(state["base"]["commit"], "--", EXP)
    untracked = [p for p in repo.untracked_files if p.startswith(EXP) and p.endswith(".py")]
    for path in untracked:
        diff += "\n" + repo.git.diff("--no-index", "/dev/null", path, with_exceptions=False)
    findings = check_files_for_forbidden_calls(diff, repo.working_tree_dir, scope=EXP)
    if not findings:
        return None
    return Violation(message="added lines use calls the skill forbids: " + "; ".join(findings[:5]),
                     paths=tuple(sorted({f.split(":", 1)[0] for f in findings})))


def commit_inside_scope(events: list[dict[str, Any]], state: dict[str, Any]) -> list[tuple[int, str]]:
    """Every commit the run made touches only the experiment folder."""
    found = []
    for event in events:
        if event["type"] == "record_added" and event["data"]["kind"] == "commit":
            record = event["data"]["record"]
            outside = [p for p in record.get("files", []) if not p.startswith(EXP)]
            if outside:
                found.append((event["seq"], f"commit {record.get('hash', '?')[:10]} touches {', '.join(outside)}"))
    return found


def no_questions_in_gap(events: list[dict[str, Any]], state: dict[str, Any]) -> list[tuple[int, str]]:
    """The skill forbids asking the user during the gap analysis."""
    return [(e["seq"], "question asked during gap_analysis") for e in events
            if e["type"] == "question_asked" and e["phase"] == "gap_analysis"]


def numerics_tier_matches_kl(events: list[dict[str, Any]], state: dict[str, Any]) -> list[tuple[int, str]]:
    """Each recorded numerics verdict (synthetic, pretrained) equals the tier of its KL under our frozen thresholds."""
    found = []
    for event in events:
        if event["type"] != "phase_completed" or event["phase"] != "numerics":
            continue
        data = event["data"]["data"]
        for row in [data.get("verdict") or {}, *data.get("diagnostics", [])]:
            kl, status = row.get("kl"), row.get("status")
            if not isinstance(kl, (int, float)) or status not in ("PASS", "WARN", "FAIL"):
                continue
            tier = "PASS" if kl < KL_PASS else "WARN" if kl < KL_WARN else "FAIL"
            if tier != status:
                found.append((event["seq"], f"{row.get('dtype')}: status {status} but KL {kl:.2e} is {tier}"))
        found += pretrained_tier_mismatch(event["seq"], data.get("pretrained") or {})
    return found


def pretrained_tier_mismatch(seq: int, row: dict[str, Any]) -> list[tuple[int, str]]:
    """The skill's Phase 3b tier has no WARN: PASS below 1e-3, else FAIL."""
    kl, status = row.get("kl"), row.get("status")
    if not isinstance(kl, (int, float)) or status not in ("PASS", "WARN", "FAIL"):
        return []
    tier = "PASS" if kl < KL_WARN else "FAIL"
    if tier == status:
        return []
    return [(seq, f"pretrained {row.get('model')}: status {status} but KL {kl:.2e} is {tier} "
                  "(skill 3b: PASS below 1e-3)")]


NE = EXP + ".claude/skills/add_moe_model/scripts/numerical_equivalence.py"
NEP = EXP + ".claude/skills/add_moe_model/scripts/numerical_equivalence_pretrained.py"
FROZEN = (NE, NEP)


def frozen_thresholds_guard(state: dict[str, Any]) -> Violation | None:
    """The numerics scripts keep their comparison logic and thresholds: only _MODEL_CONFIGS may change."""
    from phases.add_moe_model.config_entry import check_only_model_configs_changed

    repo, base = open_repo(state["target"]), state["base"]["commit"]
    problems = []
    for path in FROZEN:
        before = base_text(repo, base, path)
        file = Path(repo.working_tree_dir) / path
        after = file.read_bytes().decode("utf-8") if file.is_file() else None
        if before == after:
            continue
        if before is None or after is None:
            problems.append(f"{path} was {'created' if before is None else 'deleted'}")
        elif path == NEP:
            problems.append(f"{path} changed")
        else:
            problems += [f"{path}: {p}" for p in check_only_model_configs_changed(before, after)]
    if not problems:
        return None
    return Violation(message="frozen numerics code changed (thresholds and comparison logic stay as at the base): "
                             + "; ".join(problems), paths=tuple(p for p in FROZEN))


def base_text(repo: Any, commit: str, path: str) -> str | None:
    """The file's exact text at ``commit`` (None when absent there, as in torchtitan 0.3.0).

    Read from the blob, not ``git show``: GitPython strips the trailing newline of a
    command's output, which made an untouched script look changed.
    """
    try:
        blob = repo.commit(commit).tree / path
    except KeyError:
        return None
    return blob.data_stream.read().decode("utf-8")


def parallelism_rows_accounted(events: list[dict[str, Any]], state: dict[str, Any]) -> list[tuple[int, str]]:
    """Skill A.5: a passed parallelism phase has every row PASS, FAIL with a root cause, or UNRUN a human accepted."""
    found, accepted = [], set()
    for event in events:
        data = event["data"]
        if event["type"] == "answer_accepted" and data["key"] == "unrun_rows" and event["actor"] == "human":
            accepted.add(data["value"])
        if event["type"] != "phase_completed" or event["phase"] != "parallelism" or data["outcome"] != "passed":
            continue
        for row in data["data"].get("rows", []):
            if row["status"] == "FAIL" and not row.get("root_cause"):
                found.append((event["seq"], f"{row['config']}: FAIL without a root cause"))
            elif row["status"] == "UNRUN" and "accept" not in accepted:
                found.append((event["seq"], f"{row['config']}: UNRUN but no human accepted unrun rows"))
            elif row["status"] not in ("PASS", "FAIL", "UNRUN"):
                found.append((event["seq"], f"{row['config']}: status {row['status']!r} (skill: PASS or FAIL)"))
    return found
