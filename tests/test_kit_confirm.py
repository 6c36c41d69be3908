"""Fresh-process confirmation, the measure_once script, and provenance (real git, real subprocesses)."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from phases.kit.confirm import confirm_in_fresh_processes, parse_result
from phases.kit.records import NotApplicable
from tests.conftest import ROOT, make_repo

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
    conf = confirm_in_fresh_processes([sys.executable, str(script), str(tmp_path / "n")], runs=5)
    assert [r.status for r in conf.runs] == ["ok", "FAILED", "FAILED", "ok", "ok"]
    assert conf.failed == (1, 2)
    assert conf.runs[1].returncode == 3 and conf.runs[1].result is None
    assert conf.samples == (10.0, 13.0, 14.0)
    assert conf.median == 13.0 and conf.spread_pct == pytest.approx(3 / 13 * 100)


def test_a_result_without_the_metric_is_failed(tmp_path: Path):
    cmd = [sys.executable, "-c", "print('RESULT {\"kernel_ms\": 1.0}')"]
    conf = confirm_in_fresh_processes(cmd, runs=1, metric="wall_ms")
    assert conf.failed == (0,) and "no numeric 'wall_ms'" in conf.runs[0].log_tail


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this host has nvidia-smi")
def test_gpu_polling_says_it_is_not_available_without_nvidia_smi():
    conf = confirm_in_fresh_processes([sys.executable, "-c", "print('RESULT {\"wall_ms\": 1}')"], runs=1)
    assert isinstance(conf.gpu_poll, NotApplicable) and "nvidia-smi not available" in conf.gpu_poll.reason
    assert conf.contaminated == ()


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
    conf = confirm_in_fresh_processes(cmd, runs=3, env={"PYTHONPATH": str(ROOT)})
    assert conf.failed == (), conf.runs[0].log_tail
    assert len(conf.samples) == 3 and conf.median > 0
    result = conf.runs[0].result
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
    proc_conf = confirm_in_fresh_processes(
        [sys.executable, "-m", "phases.kit.measure_once", "--harness", "tests.test_kit_tiny_harness:build_harness",
         "--tree", "bogus", "--tokens", "8", "--device", "cpu"], runs=1, env={"PYTHONPATH": str(ROOT)})
    assert proc_conf.failed == (0,) and "unknown tree 'bogus'" in proc_conf.runs[0].log_tail
    assert json.dumps(proc_conf.model_dump(mode="json"))
