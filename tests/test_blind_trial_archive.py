"""The blind trial of 2026-12-05 (bench/results/2026-12-05-blind-trial-mcp-5): five runs driven at once through
one MCP server, each `done`, whose trails audit intact against the signer's public key and signed heads."""

from __future__ import annotations

import json
from pathlib import Path

from tests.trail_archives import audit_pinned, unpack

MODELS = {"glm4_moe_lite", "qwen3_5_moe_text", "kolibri1", "beam", "mimo_v2_flash"}


def test_the_five_runs_are_done_and_audit_intact_against_the_pinned_key(tmp_path: Path) -> None:
    state = unpack("2026-12-05-blind-trial-mcp-5", tmp_path) / "state"
    audited = audit_pinned(tmp_path)
    assert audited.returncode == 0, audited.stdout[-2000:]
    body = json.loads(audited.stdout)
    assert body["ok"] and len(body["runs"]) == 5
    snapshots = [json.loads((run / "run.json").read_text()) for run in (state / "runs").iterdir()]
    assert {s["options"]["model_type"] for s in snapshots} == MODELS
    assert {s["status"] for s in snapshots} == {"done"}
    assert all(s["records"].get("commit") for s in snapshots)
