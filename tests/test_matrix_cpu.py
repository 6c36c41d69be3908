"""Every entry point on both targets, on CPU: the combinations a user meets first (issue 22).

``run`` and ``survey --models`` on the embedded 0.3.0 workspace and on a torchtitan main checkout
(the four shared runs of tests/run_fixtures.py), and ``resume --results`` on a survey run of each
tree (a survey run waits at parallelism for exactly that: its torchrun rows' logs). Each
combination is held to the same bar: a verdict with its firmness figures (fp64 KL, one-ulp
spread), and no worker exception raised in our own code or process plumbing, whatever the run's
outcome (a traceback in any worker log is attributed as the survey attributes it; ours fails the
test).
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from phases.add_moe_model.error_triage import OURS
from phases.add_moe_model.survey.outcome import attribute_traceback
from tests.conftest import ROOT, cli
from tests.run_fixtures import MAIN_SURVEY_MODELS

pytestmark = pytest.mark.slow


def our_exceptions(run_dir: Path) -> list[str]:
    """Every worker or trainer log of the run whose traceback is ours, and every finding that says so."""
    state = json.loads((run_dir / "run.json").read_text())
    found = []
    for log in sorted((run_dir / "artifacts").rglob("*.log")):
        text = log.read_text(errors="replace")
        if "Traceback (most recent call last)" in text:
            who = attribute_traceback(text, roots=(state["target"],), summary="", log=log.name)
            if who["outcome"] == "error":
                found.append(f"{log.relative_to(run_dir)}: {who['reasons'][0]}")
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["type"] == "phase_completed":
            found += [f"{event['phase']}: {i['code']}: {i['message']}" for i in event["data"].get("issues", [])
                      if i["code"] in OURS]
    return found


def firmness_of(run_dir: Path) -> dict:
    verdict = json.loads((run_dir / "run.json").read_text())["results"]["numerics"]["verdict"]
    firm = verdict.get("firmness") or {}
    assert verdict["status"] in ("PASS", "WARN", "FAIL"), verdict
    assert "error" not in firm and firm.get("kl_fp64") is not None and firm.get("spread") is not None, verdict
    return firm


def check_run(state_dir: Path, run_id: str) -> dict:
    run_dir = state_dir / "runs" / run_id
    assert our_exceptions(run_dir) == [], run_id
    return firmness_of(run_dir)


def test_run_on_the_embedded_target(qwen_run):
    assert qwen_run["code"] == 0 and qwen_run["status"]["status"] == "done", qwen_run["status"]
    check_run(qwen_run["state"], qwen_run["status"]["run_id"])


def test_run_on_main(main_qwen_run):
    assert main_qwen_run["code"] == 0, main_qwen_run["stderr"][-2000:]
    check_run(main_qwen_run["state"], main_qwen_run["status"]["run_id"])


@pytest.mark.parametrize("which", ["embedded_survey", "main_survey"])
def test_survey_on_each_tree(which, request):
    survey = request.getfixturevalue(which)
    assert survey["body"], survey["stderr"][-3000:]
    rows = {r["model_type"]: r for r in survey["body"]["rows"]}
    assert survey["body"]["counts"]["error"] == 0, [r for r in rows.values() if r["outcome"] == "error"]
    for model_type in MAIN_SURVEY_MODELS.split(","):
        row = rows[model_type]
        assert row["numerics"] and row["numerics"]["kl_fp64"] is not None, row
        check_run(survey["state"], row["run_id"])
    assert all(our_exceptions(survey["state"] / "runs" / r["run_id"]) == [] for r in rows.values() if r["run_id"])


def test_the_main_survey_ran_side_by_side_and_merged_every_row(main_survey):
    out = main_survey["home"] / "out"
    plan = json.loads((out / "jobs.json").read_text())
    assert sorted(sum(plan["chunks"], [])) == sorted(MAIN_SURVEY_MODELS.split(",")) and len(plan["chunks"]) == 2
    merged = json.loads((out / "survey.json").read_text())
    assert [r["model_type"] for r in merged["rows"]] == MAIN_SURVEY_MODELS.split(",")
    for index in range(2):
        assert (out / "tasks" / f"{index}.log").read_text().count("warm worker ready") == 1


H200_RUN = ROOT / "bench/results/2026-12-02-h200-matrix/readme1-cuda/readme1.tgz"


def h200_row_logs(dest: Path) -> Path:
    """The FSDP-1gpu log the H200 wrote for README command 1, with its exit status, as a job leaves them."""
    with tarfile.open(H200_RUN) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("parallelism/FSDP-1gpu.log"))
        (dest / "FSDP-1gpu.log").write_bytes(tar.extractfile(member).read())
    (dest / "FSDP-1gpu.rc").write_text("0\n")
    return dest


@pytest.mark.parametrize("which", ["embedded_survey", "main_survey"])
def test_resume_results_hands_back_a_row_on_each_tree(which, request, tmp_path):
    survey = request.getfixturevalue(which)
    run_id = next(r["run_id"] for r in survey["body"]["rows"] if r["model_type"] == "olmoe")
    handed = cli("resume", run_id, "--results", str(h200_row_logs(tmp_path)), "--json", state_dir=survey["state"],
                 timeout=900)
    status = json.loads(handed.stdout.strip().splitlines()[-1])
    assert handed.returncode == 3 and [q["key"] for q in status["pending"]] == ["unrun_rows"], handed.stderr[-2000:]
    done = cli("resume", run_id, "--answer", "unrun_rows=accept", "--json", state_dir=survey["state"], timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    run_dir = survey["state"] / "runs" / run_id
    rows = {r["config"]: r for r in json.loads((run_dir / "run.json").read_text())["results"]["parallelism"]["rows"]}
    assert rows["FSDP-1gpu"]["status"] == "PASS" and rows["FSDP-1gpu"]["source"].startswith("handed back from")
    assert our_exceptions(run_dir) == []
    assert cli("audit", run_id, state_dir=survey["state"], timeout=300).returncode == 0


def test_the_exception_check_can_fail(tmp_path):
    """A traceback whose innermost owned frame is ours is reported (the check above is not vacuous)."""
    from orchestrator.worker import PROJECT_ROOT

    run_dir = tmp_path / "run"
    (run_dir / "artifacts" / "logs").mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"target": str(tmp_path / "tt")}))
    (run_dir / "events.jsonl").write_text("")
    (run_dir / "artifacts" / "logs" / "000001-numerics.log").write_text(
        "Traceback (most recent call last):\n"
        f'  File "{PROJECT_ROOT}/phases/add_moe_model/work/firmness.py", line 47, in measure_firmness\n'
        "    tt_moved = titan(layout.tokens(moved))\n"
        "RuntimeError: output with shape [8] doesn't match the broadcast shape [16, 8]\n")
    assert our_exceptions(run_dir) == ["artifacts/logs/000001-numerics.log: RuntimeError: output with shape [8] "
                                       "doesn't match the broadcast shape [16, 8] at phases/add_moe_model/work/"
                                       "firmness.py:47 (our code; log artifacts/000001-numerics.log)"]
