"""Phase 6: lint and commit (skill A.7).

``pre-commit`` runs on the changed files when the target has a config (with
``SKIP=pyrefly-check``); the diff must lie inside the experiment folder and contain no core
file; then, if pre-flight said "auto", one commit on the chosen branch with the skill's
message, whose numbers come from the recorded events. With "never" the tree is left
uncommitted for review. The commit hash and its file list are recorded (audit checks them).
A folder that differs from what numerics measured is never committed: the run goes back to
numerics first (``measured_tree``).
"""

from __future__ import annotations

import os
import shutil
import subprocess

from orchestrator.git import changed_paths, open_repo
from orchestrator.phase_api import Issue, PhaseContext, PhaseResult
from phases.add_moe_model.cited import EVENT_TYPES, Cited
from phases.add_moe_model.layer_kinds_text import layer_kind_lines
from phases.add_moe_model.measured_tree import check_measured
from phases.add_moe_model.model_numbers import real_numbers, synthetic_numbers
from phases.add_moe_model.model_source import model_name
from phases.add_moe_model.not_clean import not_clean_rows, summary_suffix
from phases.add_moe_model.records import CommitRecord, Preflight, Results
from phases.add_moe_model.workspace import EXP

PRE_COMMIT_CONFIG = ".pre-commit-config.yaml"


def run(ctx: PhaseContext) -> PhaseResult:
    files = changed_paths(ctx.target, ctx.base["commit"])
    outside = [p for p in files if not p.startswith(EXP)]
    if outside:
        return PhaseResult(outcome="failed", summary=f"refusing to commit: {len(outside)} path(s) outside {EXP}",
                           issues=(Issue(code="commit_outside_scope", message=", ".join(outside),
                                         fix_location="revert the core files (git checkout BASE -- PATH)"),))
    stale = check_measured(ctx, phase="commit")
    if stale is not None:
        return stale
    lint = run_pre_commit(ctx, files)
    if lint["status"] == "MISSING":
        return PhaseResult(outcome="failed", summary=lint["reason"], data={"lint": lint},
                           issues=(Issue(code="pre_commit_missing", message=lint["output_tail"],
                                         fix_location="pip install pre-commit, then advance"),))
    if lint["status"] == "FAIL":
        return PhaseResult(outcome="needs_agent", summary="pre-commit failed on the changed files", data={"lint": lint},
                           issues=(Issue(code="pre_commit_failed", message=lint["output_tail"], fix_location=EXP),))
    results = Results.model_validate(ctx.results)
    cited = Cited.from_events(ctx.run_id, ctx.events(*EVENT_TYPES))
    caveat = summary_suffix(results, cited)
    if not ctx.answers.get("commit") == "auto":
        return PhaseResult(outcome="passed",
                           summary=f"{len(files)} file(s) left uncommitted for review (pre-flight: never){caveat}",
                           data={"lint": lint, "files": files, "committed": False})
    message = ctx.render("commit_message.txt.j2", **message_values(results, ctx.options, cited))
    commit = make_commit(ctx, files, message)
    if isinstance(commit, PhaseResult):
        return commit
    ctx.add_record("commit", commit)
    return PhaseResult(outcome="passed", summary=f"committed {commit.hash[:10]} on {commit.branch} "
                       f"({len(commit.files)} file(s)){caveat}",
                       data={"lint": lint, **commit.model_dump(mode="json"), "committed": True})


def run_pre_commit(ctx: PhaseContext, files: list[str]) -> dict[str, str]:
    if not (ctx.target / PRE_COMMIT_CONFIG).is_file():
        return {"status": "SKIPPED", "reason": f"the target has no {PRE_COMMIT_CONFIG}", "output_tail": ""}
    if shutil.which("pre-commit") is None:
        return {"status": "MISSING", "reason": "pre-commit is not installed", "output_tail":
                "the target has a pre-commit config but `pre-commit` is not on PATH: pip install pre-commit"}
    existing = [f for f in files if (ctx.target / f).exists()]
    done = subprocess.run(["pre-commit", "run", "--files", *existing], cwd=ctx.target, capture_output=True,
                          text=True, env={**os.environ, "SKIP": "pyrefly-check"})
    log = ctx.write_artifact("pre-commit.log", done.stdout + done.stderr)
    tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
    return {"status": "PASS" if done.returncode == 0 else "FAIL", "log": log, "output_tail": tail, "reason": ""}


def message_values(results: Results, options: dict[str, object], cited: Cited) -> dict[str, object]:
    """The commit message's values: the model's name, both sets of numbers and the verdict, each with its seq."""
    assert results.numerics is not None
    verdict = results.numerics.verdict
    real = real_numbers(results, dict(options), cited)
    return {"model_name": model_name(dict(options)), "run_id": cited.run_id,
            "synthetic": synthetic_numbers(results, cited).as_data(), "real": real.as_data() if real else None,
            "status": verdict.status, "kl": verdict.kl, "max_diff": verdict.max_diff,
            "numerics_seq": cited.phase("numerics"), "layer_kinds": layer_kind_lines(results, cited),
            "not_clean": [row.line() for row in not_clean_rows(results, cited)]}


def make_commit(ctx: PhaseContext, files: list[str], message: str) -> CommitRecord | PhaseResult:
    repo = open_repo(ctx.target)
    if repo.head.is_detached:
        return PhaseResult(outcome="failed", summary="refusing to commit on a detached HEAD",
                           issues=(Issue(code="detached_head", message="HEAD is detached; check out the branch chosen "
                                         "in pre-flight", fix_location="git checkout BRANCH"),))
    branch = repo.active_branch.name
    chosen = ctx.result("preflight", Preflight).branch if "preflight" in ctx.results else None
    if chosen and chosen != branch:
        return PhaseResult(outcome="failed", summary=f"HEAD is on {branch}, pre-flight chose {chosen}",
                           issues=(Issue(code="wrong_branch", message=f"check out {chosen}",
                                         fix_location="git checkout " + chosen),))
    repo.git.add("--", *files)
    repo.git.commit("-m", message)
    head = repo.head.commit
    return CommitRecord(hash=head.hexsha, branch=branch, files=tuple(sorted(head.stats.files)))
