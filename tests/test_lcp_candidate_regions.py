"""A candidate enables exactly the regions it names; regions its changes touch are offered, never defaulted.

Real git: a copy of the embedded workspace, whose shipped narrow-scores branch changes
``expert_swiglu`` in experts.py, the function that declares the swiglu region (not enabled
on main); the tests add branches of their own that change other functions.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import git
import pytest

from orchestrator.errors import UsageError
from orchestrator.workspaces import commit_as_bot
from phases.local_compile_perf.candidates import CandidateArgs, accept_candidate
from phases.local_compile_perf.pick_fix import last_verdict, take_submission, wait_for_agent
from phases.local_compile_perf.records import Candidate
from phases.local_compile_perf.results import CandidateVerdict
from phases.local_compile_perf.region_offer import offered
from phases.local_compile_perf.stack import prepare_candidate
from phases.local_compile_perf.workflow import WORKFLOW

BRANCH = "candidate/narrow-scores"
EXPERTS, NORM, ROPE = (f"examples/moe_layer/{name}.py" for name in ("experts", "norm", "rope"))


@pytest.fixture
def target(embedded_workspace: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "workspace"
    shutil.copytree(embedded_workspace, copy)
    return copy


def submit_ctx(target: Path) -> SimpleNamespace:
    main = git.Repo(target).heads.main.commit.hexsha
    state: dict[str, Any] = {"workflow": "local-compile-perf", "target": str(target), "base": {"commit": main},
                             "records": {}}

    def add_record(kind: str, record: dict[str, Any]) -> None:
        state["records"].setdefault(kind, []).append(record)

    return SimpleNamespace(state=state, actor="agent", add_record=add_record)


def submit(ctx: SimpleNamespace, **args: Any) -> None:
    accept_candidate(ctx, CandidateArgs.model_validate({"branch": BRANCH, "label": "narrow", **args}), None)


def branch_off_main(target: Path, name: str, edits: dict[str, tuple[str, str]]) -> str:
    """Branch ``name`` off main with one commit that replaces each file's ``old`` text by ``new``; back on main."""
    repo = git.Repo(target)
    repo.git.checkout("-b", name, "main")
    for path, (old, new) in edits.items():
        text = (target / path).read_text()
        assert text.count(old) == 1, (path, old)
        (target / path).write_text(text.replace(old, new))
    repo.index.add(list(edits))
    commit_as_bot(repo, name)
    repo.git.checkout("main")
    return name


def test_unnamed_regions_of_the_changed_files_are_offered_not_enabled(target):
    ctx = submit_ctx(target)
    assert offered(target, BRANCH, ctx.state["base"]["commit"]) == {"swiglu": "examples/moe_layer/experts.py"}
    with pytest.raises(UsageError, match=r'swiglu \(examples/moe_layer/experts.py\).*regions \["swiglu"\] '
                                         r'\(CLI: --regions swiglu\).*regions "none"'):
        submit(ctx)
    assert ctx.state["records"] == {}
    # blind trial of 2026-12-05: "in branch 'candidate/x''s tree" read as a stray quote
    with pytest.raises(UsageError, match=r"\['rope_typo'\] are not declared anywhere in the tree of branch "
                                         r"'candidate/narrow-scores' \(declared: "):
        submit(ctx, regions="swiglu,rope_typo")
    assert ctx.state["records"] == {}
    submit(ctx, regions="none")
    submit(ctx, regions=["swiglu"])
    assert [s["regions"] for s in ctx.state["records"]["candidate_submitted"]] == [[], ["swiglu"]]


def test_a_candidate_naming_none_runs_with_the_stack_regions_only(target, tmp_path):
    ctx = submit_ctx(target)
    submit(ctx, regions="none")
    (submission,) = ctx.state["records"]["candidate_submitted"]
    prepared = prepare_candidate(target, state=ctx.state, submission=Candidate.model_validate(submission),
                                 root=tmp_path / "wt")
    assert "examples/moe_layer/experts.py" in prepared.files
    assert prepared.candidate_regions == () and prepared.regions_source == "none named"
    assert prepared.tree_regions == ["router"]


def test_the_offer_is_shown_before_submitting(target):
    """explain shows the submission's schema and the waiting phase's findings: the regions the stack leaves off."""
    described = WORKFLOW.submissions["candidate"].args.model_json_schema()["properties"]["regions"]["description"]
    assert "Exactly these are enabled" in described and "nothing is enabled by default" in described
    ctx = submit_ctx(target)
    ctx.target, ctx.run_id = target, "run-1"
    bandwidth = {"tbs": 1.0, "nbytes": 1, "copies": 1, "seconds": 1.0, "warmup": 1, "kind": "hbm", "label": "x"}
    ctx.results = {"rank": {"ranked": [], "dropped": [], "tokens": 256, "layer_ms": 10.0, "unregioned_ms": 0.0,
                            "eager_glue_ms": 0.0, "stop": {"stop": False, "reason": "open", "threshold": 0.01,
                                                            "caveat": ""}},
                   "ideal_times": {"bandwidth": bandwidth, "tokens": 256, "rows": [], "regions_found": []}}
    ctx.result = lambda phase, model: model.model_validate(ctx.results[phase])
    waiting = wait_for_agent(ctx)
    assert waiting.outcome == "needs_agent" and "swiglu" in waiting.data["regions_not_enabled"]
    assert "router" not in waiting.data["regions_not_enabled"]
    assert "enables only the regions it names" in waiting.issues[0].message


def test_only_regions_whose_function_the_branch_changes_or_adds_are_offered(target):
    """The trial of 2026-12-04 (5a): a change to another function of experts.py was told to enable swiglu too."""
    ctx = submit_ctx(target)
    main = ctx.state["base"]["commit"]
    other = branch_off_main(target, "candidate/scale-after", {EXPERTS: (
        "        return (out.float() * weights.unsqueeze(-1)).to(out.dtype)",
        "        return out * weights.unsqueeze(-1).to(out.dtype)")})
    assert offered(target, other, main) == {}
    accept_candidate(ctx, CandidateArgs(branch=other, label="scale after"), None)
    assert ctx.state["records"]["candidate_submitted"][-1]["regions"] == []
    last_line = "        return torch.cat([chunk @ w[e].T for e, chunk in enumerate(chunks)])\n"
    new_region = '\n\n@local_compile("expert_scale")\ndef expert_scale(x):\n    return x\n'
    mixed = branch_off_main(target, "candidate/mixed", {
        EXPERTS: (last_line, last_line + new_region),
        NORM: ('    """Return ``x / rms(x) * weight`` computed in fp32, in ``x.dtype``."""\n', "")})
    assert offered(target, mixed, main) == {"expert_scale": EXPERTS, "rms_norm": NORM}


def test_named_regions_the_changes_do_not_touch_are_accepted_and_said(target, tmp_path):
    """The trial's 5d: rope, named for a branch that changes experts.py only, ran without a word about it."""
    ctx = submit_ctx(target)
    submit(ctx, regions=["swiglu", "rope"])
    (record,) = ctx.state["records"]["candidate_submitted"]
    assert record["regions"] == ["swiglu", "rope"] and record["untouched_regions"] == {"rope": ROPE}
    notes: list[str] = []
    ctx.target, ctx.scratch_dir = target, tmp_path
    ctx.note = lambda text, kind: notes.append(text)
    assert take_submission(ctx, Candidate.model_validate(record)).outcome == "passed"
    assert notes[-1].endswith("on top of ['router']; it named regions its changes do not touch: "
                              f"rope ({ROPE}) (enabled as declared)"), notes
    verdict = CandidateVerdict(id=record["id"], branch=BRANCH, label="narrow", verdict="rejected",
                               phase="graph_budget", reason="graphs per region over the headroom target 6 of 8: rope 8",
                               kept_branch=None)
    line = last_verdict([verdict], [Candidate.model_validate(record)])
    assert line.startswith("last candidate 'narrow' rejected at graph_budget: graphs per region")
    assert "it named regions its changes do not touch: rope (examples/moe_layer/rope.py)" in line
