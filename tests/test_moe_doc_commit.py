"""Phase 5 (MODEL_COMPATIBILITY.md) and Phase 6 (commit) on real git repos, with a small context."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import git
import pytest

from orchestrator.context import render_template
from phases.add_moe_model import commit, compat_doc
from phases.add_moe_model.measured_tree import snapshot_experiment
from phases.add_moe_model.workflow import WORKFLOW
from phases.add_moe_model.workspace import EXP
from tests.conftest import make_repo

PROBE = {"model_type": "qwen3_moe", "score_func": "softmax", "top_k": 8, "num_experts": 128, "route_norm": True,
         "hidden_size": 2048, "moe_intermediate_size": 768, "shared_experts": "none", "attention": "gqa",
         "moe_mechanism": "decoder_sparse_step", "min_layers_needed": 1, "issues": []}
ENTRY = {"model_type": "qwen3_moe", "hidden_size": 2048, "moe_intermediate_size": 768, "num_experts": 8,
         "num_experts_per_tok": 2, "num_hidden_layers": 1}
VERDICT = {"status": "WARN", "kl": 1.15e-06, "max_diff": 3.91e-03, "cos_sim": 0.999996,
           "roundtrip": {"status": "PASS"}}


def torchrun_row(config: str, world_size: int, status: str, **rest: Any) -> dict[str, Any]:
    """A torchrun row as parallel_matrix.base_record starts it, with ``rest`` on top."""
    return {"config": config, "world_size": world_size, "tp": 1, "ep": 1, "command": f"torchrun {config}",
            "status": status, "error": "", "root_cause": "", "log": None, "ran": False, **rest}


def build_row(world_size: int, status: str, **rest: Any) -> dict[str, Any]:
    """One world size of the sharding build check (the worker's WorldResult)."""
    return {"world_size": world_size, "tp": 1, "ep": world_size, "status": status, **rest}


def parallel_data(rows: list[dict[str, Any]], build: list[dict[str, Any]]) -> dict[str, Any]:
    return {"rows": rows, "build_check": build, "gpus": 0, "torch_compat": {"torch": "2.13.0+cpu", "applied": []},
            "fsdp": {"ok": False, "accepts_dp_mesh_dims": True, "torch": "2.13.0+cpu", "error": "ValueError: ..."}}


PHASE_ORDER = ("preflight", "probe", "synthetic_config", "numerics", "gap_analysis", "parallelism")


class Ctx:
    """The parts of PhaseContext these two phases use, over a real repository."""

    run_id = "add-moe-model-test"

    def __init__(self, target: Path, *, answers: dict[str, Any], verdict: dict[str, Any] = VERDICT) -> None:
        self.target, self.answers = target, answers
        self.base = {"commit": git.Repo(target).head.commit.hexsha}
        self.options = {"model_id": "Qwen/Qwen3-30B-A3B"}
        self.results = {"probe": PROBE, "numerics": {"verdict": verdict},
                        "synthetic_config": {"entry": ENTRY},
                        "parallelism": parallel_data([torchrun_row("FSDP-1gpu", 1, "UNRUN")], [build_row(2, "PASS")]),
                        "preflight": {"branch": "main", "auto_commit": answers.get("commit") == "auto",
                                      "base_commit": self.base["commit"]}}
        self.results["numerics"]["measured_tree"] = snapshot_experiment(target, self.base["commit"])
        self.artifacts: dict[str, str] = {}
        self.added: list[tuple[str, dict]] = []

    @property
    def state(self) -> dict[str, Any]:
        records: dict[str, list[dict]] = {}
        for kind, record in self.added:
            records.setdefault(kind, []).append(record)
        return {"records": records}

    def render(self, template: str, **values: Any) -> str:
        return render_template("add_moe_model", template, **values)

    def write_artifact(self, name: str, content: str) -> str:
        self.artifacts[name] = content
        return name

    def add_record(self, kind: str, record: Any) -> None:
        dump = getattr(record, "model_dump", None)
        self.added.append((kind, dump(mode="json") if dump else record))

    def result(self, phase: str, model: Any) -> Any:
        return model.model_validate(self.results[phase])

    def records(self, model: Any) -> list[Any]:
        kind = WORKFLOW.record_kind(model)
        return [model.model_validate(r) for k, r in self.added if k == kind]

    def events(self, *types: str) -> list[dict[str, Any]]:
        """The trail the engine would have written for these results: the answers, then each phase's records
        and completion in the workflow's order."""
        bodies: list[tuple[str, str | None, dict[str, Any]]] = [
            ("answer_accepted", None, {"key": key, "value": value}) for key, value in self.answers.items()]
        for phase in (p for p in PHASE_ORDER if p in self.results):
            if phase == "gap_analysis":
                bodies += [("record_added", phase, {"kind": "gap_row", "record": row})
                           for row in self.results[phase]["rows"]]
            bodies.append(("phase_completed", phase, {"outcome": "passed", "data": self.results[phase]}))
        trail = [{"seq": seq, "type": kind, "phase": phase, "data": data}
                 for seq, (kind, phase, data) in enumerate(bodies)]
        return [event for event in trail if not types or event["type"] in types]

    def seq(self, phase: str) -> int:
        return next(e["seq"] for e in self.events("phase_completed") if e["phase"] == phase)


@pytest.fixture
def target(tmp_path: Path) -> Path:
    path = tmp_path / "tt"
    make_repo(path, {f"{EXP}model.py": "x = 1\n", "torchtitan/models/common/moe.py": "y = 1\n"})
    return path


def test_compat_doc_is_created_with_its_sections_and_rerun_is_idempotent(target):
    ctx = Ctx(target, answers={"commit": "auto"})
    assert compat_doc.run(ctx).outcome == "passed"
    first = (target / compat_doc.DOC).read_text()
    for section in ("Numerical Equivalence Summary", "Architectural Differences per Model", "Parallelism Support"):
        assert f"## {section}" in first
    assert "## Core Changes Needed for Full Support" not in first  # the probe found nothing only core can fix
    assert "| Qwen3-30B-A3B | qwen3_moe | WARN | 1.15e-06 | 3.91e-03 | 0.999996 | PASS |" in first
    compat_doc.run(ctx)
    assert (target / compat_doc.DOC).read_text() == first
    ctx.results["numerics"]["verdict"] = {**VERDICT, "status": "PASS", "kl": 5.0e-07}
    compat_doc.run(ctx)
    again = (target / compat_doc.DOC).read_text()
    assert again.count("| Qwen3-30B-A3B | qwen3_moe |") == 1 and "| PASS | 5.00e-07 |" in again
    assert again.count("### Qwen3-30B-A3B (qwen3_moe)") == 1


def test_layouts_the_target_declares_unsupported_are_named_beside_the_unsupported_features(target):
    ctx = Ctx(target, answers={"commit": "auto"})
    ctx.results["parallelism"]["build_check"] = [
        build_row(2, "UNSUPPORTED", tp=2, ep=1, error="NotImplementedError: TP with DSA"), build_row(4, "PASS")]
    assert compat_doc.run(ctx).outcome == "passed"
    text = (target / compat_doc.DOC).read_text()
    assert (f"- Unsupported features: none found by the probe (probe, seq {ctx.seq('probe')}); parallel layouts the "
            "target declares unsupported: world 2 (tp=2, ep=1): NotImplementedError: TP with DSA "
            f"(parallelism, seq {ctx.seq('parallelism')})\n") in text


def test_commit_refuses_a_core_path(target):
    (target / "torchtitan/models/common/moe.py").write_text("y = 2\n")
    (target / EXP / "model.py").write_text("x = 2\n")
    head = git.Repo(target).head.commit.hexsha
    result = commit.run(Ctx(target, answers={"commit": "auto"}))
    assert result.outcome == "failed" and result.issues[0].code == "commit_outside_scope"
    assert "torchtitan/models/common/moe.py" in result.issues[0].message
    assert git.Repo(target).head.commit.hexsha == head


def test_commit_uses_the_template_and_records_the_hash(target):
    (target / EXP / "model.py").write_text("x = 2\n")
    ctx = Ctx(target, answers={"commit": "auto"})
    result = commit.run(ctx)
    assert result.outcome == "passed", result.summary
    head = git.Repo(target).head.commit
    assert head.message.splitlines()[0] == "Add Qwen3-30B-A3B to transformers MoE backend"
    assert ": H=2048, I=768, E=8, top-2, 1 layer\n" in head.message
    assert f"- numerics WARN (numerics, seq {ctx.seq('numerics')}): KL=1.15e-06, max_diff=3.91e-03" in head.message
    assert "not part of this commit" in head.message and "Adds synthetic" not in head.message
    assert ctx.added == [("commit", {"hash": head.hexsha, "branch": "main", "files": [f"{EXP}model.py"]})]


def test_commit_never_leaves_the_tree_for_review(target):
    (target / EXP / "model.py").write_text("x = 2\n")
    head = git.Repo(target).head.commit.hexsha
    result = commit.run(Ctx(target, answers={"commit": "never"}))
    assert result.outcome == "passed" and result.data["committed"] is False
    assert git.Repo(target).head.commit.hexsha == head and git.Repo(target).is_dirty()


def test_commit_refuses_a_detached_head_and_a_missing_pre_commit(target, monkeypatch):
    (target / EXP / "model.py").write_text("x = 2\n")
    repo = git.Repo(target)
    repo.git.checkout(repo.head.commit.hexsha)
    assert commit.run(Ctx(target, answers={"commit": "auto"})).issues[0].code == "detached_head"
    repo.git.checkout("main")
    (target / ".pre-commit-config.yaml").write_text("repos: []\n")
    repo.git.add(".pre-commit-config.yaml")
    repo.index.commit("lint config")
    monkeypatch.setattr(commit.shutil, "which", lambda name: None)
    ctx = Ctx(target, answers={"commit": "auto"})
    result = commit.run(ctx)
    assert result.outcome == "failed" and result.issues[0].code == "pre_commit_missing"


def test_an_edit_after_numerics_goes_back_to_numerics_instead_of_into_the_commit(target):
    (target / EXP / "model.py").write_text("x = 2\n")
    ctx = Ctx(target, answers={"commit": "auto"})  # what numerics measured
    (target / EXP / "model.py").write_text("x = 3\n")  # the agent's edit after numerics passed
    (target / EXP / "hf_sharding.py").write_text("z = 1\n")
    head = git.Repo(target).head.commit.hexsha
    result = commit.run(ctx)
    assert (result.outcome, result.route) == ("passed", "remeasure"), result.summary
    assert WORKFLOW.edges(WORKFLOW.phase("commit"))["remeasure"] == "numerics"
    assert f"{EXP}model.py (changed)" in result.summary and f"{EXP}hf_sharding.py (changed)" in result.summary
    assert "goes back to numerics" in result.summary and "Not committed" in result.summary
    assert git.Repo(target).head.commit.hexsha == head
    ctx.results["numerics"]["measured_tree"] = snapshot_experiment(target, ctx.base["commit"])  # numerics again
    assert commit.run(ctx).data["committed"] is True


def test_the_doc_is_not_written_for_a_folder_numerics_did_not_measure(target):
    (target / EXP / "model.py").write_text("x = 2\n")
    ctx = Ctx(target, answers={"commit": "auto"})
    (target / EXP / "model.py").unlink()
    result = compat_doc.run(ctx)
    assert (result.outcome, result.route) == ("passed", "remeasure"), result.summary
    assert WORKFLOW.edges(WORKFLOW.phase("compat_doc"))["remeasure"] == "numerics"
    assert f"{EXP}model.py (deleted)" in result.summary and "Not documented" in result.summary
    assert not (target / compat_doc.DOC).exists()


def test_a_folder_that_still_differs_after_five_trips_back_stops_the_run(target):
    ctx = Ctx(target, answers={"commit": "auto"})
    for n in range(6):
        (target / EXP / "log.txt").write_text(f"written between numerics and the commit {n}\n")
        result = commit.run(ctx)
        ctx.results["numerics"]["measured_tree"] = snapshot_experiment(target, ctx.base["commit"])
    assert result.outcome == "failed" and result.issues[0].code == "experiment_folder_keeps_changing"
    assert f"{EXP}log.txt (changed)" in result.issues[0].message


TORCH_CAUSE = ("torch 2.13.0+cpu: fully_shard cannot shard torchtitan's spmd_types plain parameters at world size > 1 "
               "(probe on a 2-rank fake mesh: ValueError: When dp_mesh_dims is provided, all parameters must be "
               "DTensors on the full SPMD mesh)")
CPU_ROWS = [  # what a machine without GPUs records (torch 2.13): README's "parallelism rows 3 FAIL, 1 UNRUN"
    torchrun_row("FSDP-1gpu", 1, "UNRUN", error="needs 1 GPU(s), this machine has 0"),
    *(torchrun_row(config, ws, "FAIL", root_cause=TORCH_CAUSE, fixable=False,
                   error=f"not run here (needs {ws} GPU(s), this machine has 0); the FSDP probe fails: ValueError: ...")
      for config, ws in (("FSDP", 2), ("FSDP+EP", 2), ("FSDP+TP+EP", 4))),
]


def test_a_done_run_with_failed_rows_says_so_in_its_summary_commit_message_doc_and_status(target):
    from orchestrator.render import status_text

    (target / EXP / "model.py").write_text("x = 2\n")
    ctx = Ctx(target, answers={"commit": "auto", "unrun_rows": "accept"})
    ctx.results["parallelism"]["rows"] = CPU_ROWS
    assert compat_doc.run(ctx).outcome == "passed"
    doc = (target / compat_doc.DOC).read_text()
    section = doc[doc.index("### Qwen3-30B-A3B (qwen3_moe)"):doc.index("## Parallelism Support")]
    assert "FSDP+TP+EP FAIL (4 GPUs" in section and TORCH_CAUSE in section, section
    assert "Not a clean pass: numerics WARN; parallelism rows 3 FAIL, 1 UNRUN" in section, section
    result = commit.run(ctx)
    summary = "; numerics WARN; parallelism rows 3 FAIL, 1 UNRUN (causes: numerics WARN: not explained"
    assert summary in result.summary and result.summary.endswith("each in full in MODEL_COMPATIBILITY.md)")
    message = git.Repo(target).head.commit.message
    assert message.startswith("Add Qwen3-30B-A3B to transformers MoE backend"), message
    assert "Not a clean pass:\n- numerics WARN: KL 1.15e-06" in message, message
    assert "- torchrun FSDP-1gpu (1 GPU): UNRUN: needs 1 GPU(s), this machine has 0" in message, message
    assert f"- torchrun FSDP (2 GPUs), FSDP+EP (2 GPUs), FSDP+TP+EP (4 GPUs): FAIL: {TORCH_CAUSE}" in message
    state = {"run_id": "r", "workflow": "add-moe-model", "target": str(target), "phase": "done", "status": "done",
             "summary": result.summary}
    assert summary in status_text(state)


def test_the_results_view_types_each_phase_as_the_table_does():
    from phases.add_moe_model.records import Results

    for name, field in Results.model_fields.items():
        assert field.annotation == (WORKFLOW.phase(name).returns | None), name
