"""The findings' stack measurement comes in four parts, each recorded as it finishes.

On the H200 the four together (interleaved cells, glue ops, cold compile per region, selective-AC
re-timing) can outlast one device call; cut in a later part, the phase must not measure the
earlier ones again, or a rerun is cut at the same place.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from phases.local_compile_perf import stack_code
from phases.local_compile_perf.results import StackCode, StackCodePart
from tests.conftest import make_repo


class Cut(Exception):
    pass


class FakeContext:
    """What measure_stack_code reads and writes of a PhaseContext: records, notes, the target and scratch."""

    def __init__(self, target: Path, scratch: Path) -> None:
        self.target, self.scratch_dir, self.kept, self.logged = target, scratch, {}, []

    def records(self, model: type) -> list[Any]:
        kind = {StackCode: "stack_code", StackCodePart: "stack_code_part"}[model]
        return [model.model_validate(r) for r in self.kept.get(kind, [])]

    def add_record(self, kind: str, record: dict) -> None:
        self.kept.setdefault(kind, []).append(record)

    def notes(self) -> list[dict]:
        return []

    def note(self, text: str, *, kind: str) -> None:
        self.logged.append(text)


def cell(variant: str, tokens: int) -> dict:
    return {"variant": variant, "tree": variant, "tokens": tokens, "status": "measured",
            "cited": {"wall_ms": 10.0, "glue_ms": 2.0}, "samples": {"wall_ms": [10.0], "glue_ms": [2.0]}}


def test_a_findings_rerun_measures_only_the_parts_a_cut_left_out(tmp_path, monkeypatch) -> None:
    repo = make_repo(tmp_path / "target", {"model.py": "x = 1\n"})
    tip = repo.head.commit.hexsha
    ctx = FakeContext(tmp_path / "target", tmp_path / "scratch")
    plan = SimpleNamespace(sizes=SimpleNamespace(per_layer_tokens=(256,)), tokens=(256,), per_layer_stack=True)
    calls: list[str] = []

    def part(name: str, value: Any, *, cut: bool = False):
        def measure(*args, **kwargs):
            calls.append(name)
            if cut:
                raise Cut(name)
            return value
        return measure

    cells = [cell(v, 256) for v in ("upstream_main", "per_layer_main", "regions_stack", "per_layer_stack")]
    monkeypatch.setattr(stack_code, "measure_cells", part("cells", cells))
    monkeypatch.setattr(stack_code, "measure_glue_ops", part("glue", {"call_floor_ms": None, "ops": []}))
    monkeypatch.setattr(stack_code, "measure_cold_compile", part("cold_compile", None, cut=True))
    monkeypatch.setattr(stack_code, "measure_under_ac", part("under_ac", None))
    with pytest.raises(Cut):
        stack_code.measure_stack_code(ctx, plan, tip, 1.0)
    assert calls == ["cells", "glue", "cold_compile"] and "stack_code" not in ctx.kept
    assert [p["part"] for p in ctx.kept["stack_code_part"]] == ["cells", "glue"]

    monkeypatch.setattr(stack_code, "measure_cold_compile", part("cold_compile", {"tokens": 256, "rows": []}))
    record = stack_code.measure_stack_code(ctx, plan, tip, 1.0)
    assert calls == ["cells", "glue", "cold_compile", "cold_compile", "under_ac"]
    assert record["cold_compile"] == {"tokens": 256, "rows": []} and len(record["rows"]) == 4
    assert ctx.logged == [f"stack code of {tip[:10]}: cells, glue recorded by an earlier attempt, read back; "
                          "measuring what is missing"]
    StackCode.model_validate(record)
    assert stack_code.measure_stack_code(ctx, plan, tip, 1.0) == record and len(calls) == 5
    assert not any((tmp_path / "scratch" / "worktrees").iterdir()), "the stack's worktree was left behind"
