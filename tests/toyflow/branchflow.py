"""A toy workflow whose one phase takes local-compile-perf's real ``candidate`` submission.

``pick`` waits for the agent until a submitted candidate branch holds ``allowed/fixed.txt``:
the agent edits, turns the edits into a branch (``commit_branch``) and submits it, with
the tools alone. The submission row is local-compile-perf's (its model and its check).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import git
from pydantic import BaseModel, ConfigDict

from orchestrator.phase_api import Issue, PhaseResult
from orchestrator.workflow import PhaseSpec, Prepared, Submission, Workflow
from phases.local_compile_perf.candidates import CandidateArgs
from phases.local_compile_perf.records import Candidate


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid")
    target: str


def prepare(options: Options, state_dir: str, *, runner: Any = None) -> Prepared:
    return Prepared(target=str(Path(options.target).resolve()), options=options.model_dump())


def run(ctx: Any) -> PhaseResult:
    submitted = ctx.state["records"].get("candidate_submitted", [])
    if submitted:
        branch = submitted[-1]["branch"]
        try:
            text = git.Repo(ctx.target).git.show(f"{branch}:allowed/fixed.txt")
        except git.GitCommandError:
            text = None
        if text is not None:
            return PhaseResult(outcome="passed", summary=f"branch {branch} holds the fix: {text.strip()}")
    return PhaseResult(outcome="needs_agent", summary="waiting for a candidate branch with allowed/fixed.txt",
                       issues=(Issue(code="candidate_wanted", fix_location="allowed/fixed.txt",
                                     message="write allowed/fixed.txt, commit_branch it, submit the branch"),))


WORKFLOW = Workflow(
    name="branchy", description="candidate branches through the agent tools", options=Options, prepare=prepare,
    phases=(PhaseSpec(name="pick", module="tests.toyflow.branchflow", allowed_paths=("allowed/",)),),
    submissions={"candidate": Submission(phase="pick", args=CandidateArgs, noun="candidates",
                                         check="phases.local_compile_perf.candidates:accept_candidate")},
    records={"candidate_submitted": Candidate},  # the kind the candidate check records
)
