"""The H200 runs committed under bench/results/2026-11-30-add-moe-gpu: their trails verify on CPU.

Five add-moe-model runs made on 2 H200s with torch 2.11 (bench/h200_add_moe.sh; README there).
Every trail is audited with the schema and the workflow's rules and meaning checks. Two things
are expected and nothing else: the runs were copied from a machine whose trail key is gone
(``--no-anchor``), and their run.json was written by the engine of that day, before the
snapshot gained ``agent_answers`` / ``agent_asked``; the run cut by the call's deadline
mid-phase also has run.json behind its log, as such a kill leaves it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import ROOT

EVIDENCE = ROOT / "bench/results/2026-11-30-add-moe-gpu"
CUT_BY_DEADLINE = "add-moe-model-20261130-062403-5459"
RUNS = sorted(p.name for p in (EVIDENCE / "runs").iterdir())
NEWER_SNAPSHOT_KEYS = {"agent_answers", "agent_asked"}
LAG_KEYS = {"artifacts", "chain_head", "last_seq", "updated_at"}


@pytest.mark.parametrize("run_id", RUNS)
def test_trail_audits_on_cpu(run_id: str, invoke) -> None:
    result = invoke("audit", run_id, "--schema", "--no-anchor", "--state-dir", str(EVIDENCE), "--json")
    findings = json.loads(result.output)["findings"]
    assert [f["check"] for f in findings] in ([], ["snapshot"]), findings
    if findings:
        keys = set(findings[0]["message"].split(" in: ", 1)[1].split(", "))
        allowed = NEWER_SNAPSHOT_KEYS | (LAG_KEYS if run_id == CUT_BY_DEADLINE else set())
        assert NEWER_SNAPSHOT_KEYS <= keys <= allowed, findings


def finished(model_id: str) -> list[Path]:
    runs = [EVIDENCE / "runs" / r for r in RUNS]
    return [r for r in runs if json.loads((r / "run.json").read_text())["options"]["model_id"] == model_id
            and json.loads((r / "run.json").read_text())["status"] == "done"]


@pytest.mark.parametrize("model_id", ["Qwen/Qwen3-30B-A3B", "allenai/OLMoE-1B-7B-0924"])
def test_numerics_on_cuda_and_the_rows_the_issue_asks_for(model_id: str) -> None:
    run = finished(model_id)[-1]
    assert "device=cuda" in (run / "artifacts/numerics.txt").read_text()
    state = json.loads((run / "run.json").read_text())
    assert state["results"]["numerics"]["verdict"]["status"] == "PASS"
    rows = {r["config"]: r for r in json.loads((run / "artifacts/parallelism.json").read_text())["rows"]}
    assert rows["FSDP-1gpu"]["status"] == "PASS" and [s["step"] for s in rows["FSDP-1gpu"]["steps"]] == [1, 2]
    for config in ("FSDP", "FSDP+EP", "FSDP+TP+EP"):
        assert rows[config]["status"] == "FAIL", config
        assert rows[config]["root_cause"].startswith("torch 2.11.0+cu130: fully_shard cannot shard"), config
    assert rows["FSDP"]["ran"] and rows["FSDP+EP"]["ran"] and not rows["FSDP+TP+EP"]["ran"]
