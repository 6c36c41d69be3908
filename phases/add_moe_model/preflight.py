"""Pre-flight: the skill's two questions (branch; commit or leave for review), then the branch.

Both are human-only. ``--branch`` / ``--commit`` on ``start`` answer them up front; the
base (commit, porcelain status) was recorded by the engine at start, before any edit.
"""

from __future__ import annotations

import re

from orchestrator.git import open_repo
from orchestrator.phase_api import PhaseContext, PhaseResult, Question
from phases.add_moe_model.model_source import model_name

BRANCH_PATTERN = r"^(current|new(:[A-Za-z0-9._/-]+)?)$"
QUESTIONS = (
    Question(key="branch", prompt="Work on the current branch, or a new one? (current | new | new:NAME)",
             schema={"type": "string", "pattern": BRANCH_PATTERN}),
    Question(key="commit", prompt="After all checks pass, commit automatically, or leave the changes "
                                  "uncommitted for your review?", choices=("auto", "never")),
)


def run(ctx: PhaseContext) -> PhaseResult:
    missing = tuple(q for q in QUESTIONS if q.key not in ctx.answers)
    if missing:
        return PhaseResult(outcome="needs_human", summary="pre-flight: " + " and ".join(q.key for q in missing)
                           + " not chosen yet", questions=missing)
    branch = checkout_branch(ctx, ctx.answers["branch"])
    data = {"branch": branch, "auto_commit": ctx.answers["commit"] == "auto", "base_commit": ctx.base["commit"]}
    return PhaseResult(outcome="passed", summary=f"pre-flight: branch {branch}, commit {ctx.answers['commit']}",
                       data=data)


def checkout_branch(ctx: PhaseContext, choice: str) -> str:
    """Create and check out the chosen branch (idempotent on a rerun); return its name."""
    repo = open_repo(ctx.target)
    if choice == "current":
        return "(detached)" if repo.head.is_detached else repo.active_branch.name
    name = choice.partition(":")[2] or default_branch_name(model_name(ctx.options))
    if repo.head.is_detached or repo.active_branch.name != name:
        if name in [h.name for h in repo.heads]:
            repo.git.checkout(name)
        else:
            repo.git.checkout("-b", name)
    return name


def default_branch_name(name: str) -> str:
    """``add-moe/<name>`` for the run's model name (``model_source.model_name``), lower-case, git-safe."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.").lower()
    return f"add-moe/{slug or 'model'}"
