"""Fresh processes (kit run_once), cells cited from them, measure_once, provenance (real git, real subprocesses)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from phases.kit.confirm import parse_result, probe_gpu_pids, run_once
from phases.kit.records import median_of, spread_pct_of
from phases.local_compile_perf.confirmed import build_cells
from tests.conftest import ROOT, make_repo


def fresh_runs(command: list[str], runs: int, env: dict[str, str] | None = None) -> list:
    return [run_once(command, index=i, env=env, poll_gpu=False, timeout_s=600) for i in range(runs)]

FLAKY = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    counter = Path(sys.argv[1])
    n = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(n + 1))
    if n == 1:
        sys.exit(3)  # crashes after an earlier run printed a RESULT
    if n == 2:
        print("no result line here")
        sys.exit(0)
    print("RESULT " + json.dumps({"wall_ms": 10.0 + n}))
    """
)


def test_parse_result_takes_the_last_result_line_of_this_output_only():
    assert parse_result("noise\nRESULT {\"wall_ms\": 1}\nRESULT {\"wall_ms\": 2}\n") == {"wall_ms": 2}
    assert parse_result("RESULT {not json") is None
    assert parse_result("nothing") is None


def test_failed_runs_never_reuse_an_earlier_result(tmp_path: Path):
    script = tmp_path / "flaky.py"
    script.write_text(FLAKY)
    runs = fresh_runs([sys.executable, str(script), str(tmp_path / "n")], 5)
    assert [r.status for r in runs] == ["ok", "FAILED", "FAILED", "ok", "ok"]
    assert runs[1].returncode == 3 and runs[1].result is None
    samples = tuple(r.result["wall_ms"] for r in runs if r.status == "ok")
    assert samples == (10.0, 13.0, 14.0)
    assert median_of(samples) == 13.0 and spread_pct_of(samples) == pytest.approx(3 / 13 * 100)


def _variant_runs(results: list[dict | None]) -> dict:
    runs = [{"index": i, "status": "ok" if r is not None else "FAILED", "result": r, "returncode": 0 if r else 1,
             "foreign_pids": [], "log_tail": "" if r else "boom"} for i, r in enumerate(results)]
    return {"variants": [{"variant": {"name": "eager", "checkout": ".", "tree": "eager", "tokens": [8]}, "runs": runs}]}


def test_a_cell_is_cited_only_when_every_fresh_process_measured_it():
    # a RESULT without the cell's token count did not measure what was asked: the cell is FAILED
    (cell,) = build_cells(_variant_runs([{"16": {}}, {"32": {}}, None]), runs=3)
    assert cell.status == "failed" and cell.runs_ok == 0 and "3 of 3 fresh processes FAILED" in cell.reason
    assert [f["index"] for f in cell.failed] == [2]


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this host has nvidia-smi")
def test_gpu_polling_is_not_possible_without_nvidia_smi():
    assert probe_gpu_pids() is None
    (run,) = fresh_runs([sys.executable, "-c", "print('RESULT {\"wall_ms\": 1}')"], 1)
    assert run.status == "ok" and run.foreign_pids == ()


def test_provenance_reads_the_target_commit_and_versions(tmp_path: Path):
    from phases.kit.provenance import collect_provenance

    repo = make_repo(tmp_path / "target", {"a.py": "x = 1\n"})
    prov = collect_provenance(command=["python", "-m", "x"], seed=7, target=tmp_path / "target")
    assert prov["target_commit"] == repo.head.commit.hexsha and prov["target_dirty"] is False
    assert prov["seed"] == 7 and prov["command"] == "python -m x"
    assert prov["torch"].startswith("2.") and prov["transformers"] != "not installed"
    assert prov["device_name"].startswith("cpu: ") and prov["cuda"].startswith("none")
    (tmp_path / "target" / "a.py").write_text("x = 2\n")
    assert collect_provenance(command="c", seed=0, target=tmp_path / "target")["target_dirty"] is True
    assert collect_provenance(command="c", seed=0, target=tmp_path)["target_commit"].startswith("not a git checkout")


@pytest.mark.slow
def test_measure_once_confirmed_in_three_fresh_processes():
    cmd = [sys.executable, "-m", "phases.kit.measure_once", "--harness", "tests.test_kit_tiny_harness:build_harness",
           "--tree", "upstream", "--tokens", "64", "--device", "cpu", "--dtype", "fp32",
           "--warmup", "2", "--iters", "5", "--profile-steps", "2", "--target", str(ROOT)]
    runs = fresh_runs(cmd, 3, env={"PYTHONPATH": str(ROOT)})
    assert [r.status for r in runs] == ["ok"] * 3, runs[0].log_tail
    assert median_of(tuple(r.result["wall_ms"] for r in runs)) > 0
    result = runs[0].result
    assert result["tree"] == "upstream" and result["regions"] == ["rms_norm"]
    assert result["timing"]["timer"] == "host" and len(result["timing"]["samples_ms"]) == 5
    assert result["wall_ms"] == sorted(result["timing"]["samples_ms"])[2]
    assert result["cuda_graph"] == {"status": "not_applicable", "reason": "no CUDA device"}
    assert result["timing"]["peak_memory"]["status"] == "not_applicable"
    assert set(result["not_applicable"]) == {"peak_memory", "cuda_graph", "kernel_time", "cuda_event_timing"}
    assert result["kernels"]["activity"] == "cpu" and result["kernel_count"] > 0
    assert result["provenance"]["seed"] == 0 and len(result["provenance"]["target_commit"]) >= 7
    assert result["spec"]["name"] == "tiny"


def test_measure_once_rejects_an_unknown_tree_without_a_result():
    (run,) = fresh_runs(
        [sys.executable, "-m", "phases.kit.measure_once", "--harness", "tests.test_kit_tiny_harness:build_harness",
         "--tree", "bogus", "--tokens", "8", "--device", "cpu"], 1, env={"PYTHONPATH": str(ROOT)})
    assert run.status == "FAILED" and run.result is None and "unknown tree 'bogus'" in run.log_tail
    assert json.dumps(run.model_dump(mode="json"))


def test_gpu_poll_counts_only_the_measured_gpu(tmp_path, monkeypatch):
    """Work on the host's other GPU is not an intruder; the first visible GPU is the measured one."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\n"
                    "case \"$1\" in\n"
                    "  --query-compute-apps=*) printf '101, GPU-aaa\\n202, GPU-bbb\\n303, GPU-bbb\\n' ;;\n"
                    "  --query-gpu=*) printf '0, GPU-aaa\\n1, GPU-bbb\\n' ;;\n"
                    "esac\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert probe_gpu_pids() == {101}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert probe_gpu_pids() == {202, 303}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaa")
    assert probe_gpu_pids() == {101}
