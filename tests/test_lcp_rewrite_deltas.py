"""Each rewrite of a combined stack entry measured on its own, through the real confirm worker (CPU)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import git
import pytest

from phases.kit.harness import TimingKnobs
from phases.local_compile_perf.records import Plan
from phases.local_compile_perf.rewrite_deltas import (
    BASE,
    entry_commits,
    measure_rewrite_deltas,
    prefix_checkouts,
    prefix_regions,
)
from phases.local_compile_perf.stack import add_detached_worktree
from phases.local_compile_perf.workflow import WORKFLOW
from tests.conftest import ROOT, call_handle

sys.path.insert(0, str(ROOT / "bench"))
from bench_lcp import replay_rewrites  # noqa: E402

REWRITES = ["narrow-scores", "mlp-swiglu"]


def combined_workspace(embedded_workspace: Path, tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A copy of the workspace with candidate/combined = main + the two rewrites, and its stack entry."""
    target = tmp_path / "workspace"
    shutil.copytree(embedded_workspace, target)
    replay_rewrites(target, REWRITES, branch="candidate/combined", scratch_name="combine")
    repo = git.Repo(target)
    entry = {"branch": "stack/1-combined", "source_branch": "candidate/combined",
             "parent": repo.heads.main.commit.hexsha, "commit": repo.heads["candidate/combined"].commit.hexsha,
             "stack_regions_before": ["router"], "regions": ["swiglu", "mlp_swiglu"],
             "files": repo.git.diff("--name-only", "main", "candidate/combined").split()}
    return target, entry


class Ctx:
    """The slice of PhaseContext the measurement uses; workers run as phases run them."""

    def __init__(self, target: Path, scratch: Path) -> None:
        self.target, self.scratch_dir, self.phase, self.interrupted = target, scratch, "findings", False
        self.state: dict[str, Any] = {"records": {}}
        self.measurements: list[Any] = []
        self.notes: list[tuple[str, str]] = []

    def call(self, worker: Any, request: Any, *, label: str) -> Any:
        return call_handle(worker, request, target=self.target)

    def add_record(self, kind: str, record: dict) -> None:
        self.state["records"].setdefault(kind, []).append(record)

    def records(self, model: Any) -> list[Any]:
        return WORKFLOW.records_in(self.state, model)

    def record_measurement(self, *args: Any, **kwargs: Any) -> None:
        self.measurements.append((args, kwargs))

    def note(self, text: str, *, kind: str) -> None:
        self.notes.append((kind, text))


def test_prefixes_replay_each_commit_on_the_parent_with_its_regions(embedded_workspace, tmp_path):
    target, entry = combined_workspace(embedded_workspace, tmp_path)
    assert [c.message.splitlines()[0] for c in entry_commits(target, entry)] == [
        git.Repo(target).heads[f"candidate/{name}"].commit.message.splitlines()[0] for name in REWRITES]
    made = prefix_checkouts(target, entry, tmp_path / "prefixes")
    assert [name for name, _path, _subject in made] == [BASE, "+1", "+2"]
    moe = [(path / "examples/moe_layer/moe.py").read_text() for _name, path, _subject in made]
    assert "mlp_swiglu" not in moe[1] and "mlp_swiglu" in moe[2]
    regions = [prefix_regions(path, entry, base=name == BASE) for name, path, _s in made]
    assert regions[0] == ("router",) and regions[1] == ("router", "swiglu")
    assert regions[2] == ("router", "swiglu", "mlp_swiglu")
    # a region the first commit's files declare is not enabled when the entry does not name it
    named = {**entry, "regions": ["mlp_swiglu"]}
    assert [prefix_regions(path, named, base=name == BASE) for name, path, _s in made][1:] == [
        ("router",), ("router", "mlp_swiglu")]


def test_a_single_commit_entry_has_no_deltas_to_measure(embedded_workspace, tmp_path):
    target, entry = combined_workspace(embedded_workspace, tmp_path)
    single = {**entry, "source_branch": "candidate/narrow-scores"}
    plan = SimpleNamespace()
    assert measure_rewrite_deltas(Ctx(target, tmp_path / "scratch"), plan, single) is None


def test_deltas_are_measured_recorded_and_rendered(embedded_workspace, tmp_path, monkeypatch):
    from orchestrator.context import render_template

    monkeypatch.setenv("LCP_SCALE", "small")
    target, entry = combined_workspace(embedded_workspace, tmp_path)
    add_detached_worktree(target, entry["commit"], tmp_path / "unused")  # a stale worktree must not matter
    sizes = SimpleNamespace(per_layer_tokens=(128,), timing=TimingKnobs(warmup=1, iters=2, profile_steps=1))
    plan = Plan.model_construct(harness="examples.moe_layer.harness:build_harness", device="cpu", sizes=sizes)
    ctx = Ctx(target, tmp_path / "scratch")
    record = measure_rewrite_deltas(ctx, plan, entry)
    assert ctx.state["records"]["rewrite_deltas"] == [record]
    steps = record["steps"]
    assert [s["name"] for s in steps] == [BASE, "+1", "+2"]
    for step in steps:
        (row,) = step["per_tokens"]
        assert row["glue_ms"] > 0 and row["wall_ms"] > 0, step
    (second,) = steps[2]["per_tokens"]
    assert second["glue_delta_ms"] == second["glue_ms"] - steps[1]["per_tokens"][0]["glue_ms"]
    assert not list((tmp_path / "scratch" / "worktrees").glob("deltas-*/prefix-*"))
    assert [kind for kind, _text in ctx.notes] == ["measurement"] * 3  # the devlog: one entry per prefix
    # NOTE: one fresh process each: indicative, never cited (the audit holds a cited number to 3; the CPU dry run
    # of 2026-12-05 failed its audit on these)
    assert ctx.measurements and not any(kw["labels"]["cited"] for _a, kw in ctx.measurements)
    assert measure_rewrite_deltas(ctx, plan, entry) == record  # measured once per entry: read back typed
    assert len(ctx.state["records"]["rewrite_deltas"]) == 1
    text = render_template("local_compile_perf", "findings.md.j2", s=findings_summary(record))
    assert "Each rewrite of stack/1-combined on its own" in text and "--delta-tokens" not in text
    assert f"| +2 | {steps[2]['rewrite']} |" in text
    fewer = render_template("local_compile_perf", "findings.md.j2", s=findings_summary(record, per_layer=(128, 256)))
    assert "at 128 tokens only (the run's --delta-tokens; not measured at 256):" in fewer


def findings_summary(record: dict[str, Any], *, per_layer: tuple[int, ...] = (128,)) -> dict[str, Any]:
    spec = SimpleNamespace(name="embedded:dsv3-small", layer_kinds=("dense", "moe"), ac_mode="none",
                           fp32_precision="tf32")
    plan = SimpleNamespace(spec=spec, device="cpu", device_name="cpu",
                           sizes=SimpleNamespace(per_layer_tokens=per_layer))
    return {"plan": plan, "entries": [], "per_tokens": [],
            "rejected": [], "limits": [], "not_tested": (), "feedback": [], "linear": True,
            "glue_bar_pct": 30.0, "runs": 1,
            "bandwidth": {"tbs": 0.1, "kind": "host"}, "stack_code": None, "reached_ratio": 1.5,
            "rewrite_deltas": [record]}


def test_delta_tokens_must_be_per_layer_counts(tmp_path):
    from orchestrator.errors import UsageError
    from phases.local_compile_perf.start import LcpOptions, prepare

    options = LcpOptions(target="embedded", tokens="64,128,256", per_layer_tokens="128,256", delta_tokens="64")
    with pytest.raises(UsageError, match=r"--delta-tokens \[64\] are not among --per-layer-tokens \[128, 256\]"):
        prepare(options, str(tmp_path))
    assert LcpOptions(target="embedded", delta_tokens="128").delta_tokens == (128,)
