"""Phase 4: parallelism (skill A.5).

Always: the sharding build check at world sizes 2, 4 and 8 on meta tensors with a fake
process group, through the target's own swap and ``_assert_all_states_sharded``. With GPUs
(``nvidia-smi -L``): the skill's torchrun matrix (FSDP; FSDP+EP; FSDP+TP+EP when there are
at least 4 GPUs), each row PASS or FAIL with its error excerpt. With no GPU every torchrun
row is recorded as SKIPPED with that reason, never as PASS. A SLURM script for the same
matrix is rendered for users who outgrow one node.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

from orchestrator.phase_api import Issue, PhaseContext, PhaseResult

BUILD_CHECK = "phases.add_moe_model.work.build_check:build_check"
CONFIG = "transformers_modeling_backend_debugmodel_moe"


def run(ctx: PhaseContext) -> PhaseResult:
    entry = ctx.results["synthetic_config"]["entry"]
    checks = ctx.call_worker(BUILD_CHECK, {"model_type": entry["model_type"], "config_kwargs": entry},
                             label="sharding build check")
    for row in checks["results"]:
        if declared_unsupported(row):
            row["status"] = "UNSUPPORTED"
    failed = [r for r in checks["results"] if r["status"] == "FAIL"]
    ngpu = count_gpus()
    rows = [run_torchrun_row(ctx, row, ngpu=ngpu) for row in matrix(ctx.options["model_id"], ngpu=ngpu)]
    ctx.write_artifact("parallelism/sbatch.sh", ctx.render("sbatch.sh.j2", rows=matrix(ctx.options["model_id"], ngpu=8),
                                                           model_id=ctx.options["model_id"]))
    data = {"build_check": checks["results"], "torchrun": rows, "gpus": ngpu}
    issues = [Issue(code="unknown_target_api", message=f"world {r['world_size']}: {r['error']}",
                    fix_location="phases/add_moe_model/work/build_check.py (the workflow's worker; the target "
                                 "is not at fault)") for r in failed if unknown_api(r)]
    failed = [r for r in failed if not unknown_api(r)]
    issues += [Issue(code="module_without_sharding_config",
                    message=f"world {r['world_size']} (tp={r['tp']}, ep={r['ep']}): {r['error'] or ''} "
                            f"unsharded: {', '.join(r['unsharded_modules']) or '-'}",
                    fix_location="hf_sharding.py (_set_layer_sharding_configs / set_hf_sharding_configs)")
              for r in failed]
    issues += [Issue(code="torchrun_failed", message=f"{r['name']}: {r['error']}", fix_location="experiment code")
               for r in rows if r["status"] == "FAIL"]
    passed = sum(r["status"] == "PASS" for r in checks["results"])
    unsupported = [str(r["world_size"]) for r in checks["results"] if r["status"] == "UNSUPPORTED"]
    said = f" (world {', '.join(unsupported)}: the target declares the layout unsupported)" if unsupported else ""
    summary = (f"build check {passed}/{len(checks['results'])} PASS{said}; torchrun: "
               + ", ".join(f"{r['name']} {r['status']}" for r in rows))
    if any(i.code == "unknown_target_api" for i in issues):
        return PhaseResult(outcome="failed", summary=summary, data=data, issues=tuple(issues))
    if issues:
        return PhaseResult(outcome="needs_agent", summary=summary, data=data, issues=tuple(issues))
    return PhaseResult(outcome="passed", summary=summary, data=data)


def declared_unsupported(row: dict[str, Any]) -> bool:
    """The target's own sharding code raised NotImplementedError: a limitation it states, not a bug to fix.

    e.g. main's hf_sharding refuses TP for GLM-5's DSA indexer; its parallelism table lists FSDP/EP only.
    """
    return row["status"] == "FAIL" and (row.get("error") or "").startswith("NotImplementedError")


def unknown_api(row: dict[str, Any]) -> bool:
    return (row.get("error") or "").startswith("UnknownTargetApi")


def count_gpus() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(1 for line in listing.stdout.splitlines() if line.startswith("GPU "))


def matrix(model_id: str, *, ngpu: int) -> list[dict[str, Any]]:
    """The skill's three jobs, sized to the GPU count (EP borrows from the FSDP x TP ranks)."""
    base = ["torchrun", f"--nproc-per-node={max(ngpu, 1)}", "--module", "transformers_modeling_backend",
            "--config", CONFIG, "--hf_model", model_id, "--training.steps", "2"]
    ep = max(min(ngpu, 4) // 2, 1)
    return [
        {"name": "FSDP", "command": base, "min_gpus": 1},
        {"name": "FSDP+EP", "command": base + ["--parallelism.data_parallel_shard_degree", "-1",
                                               "--parallelism.expert_parallel_degree", str(max(ngpu // 2, 1))],
         "min_gpus": 2},
        {"name": "FSDP+TP+EP", "command": base + ["--parallelism.data_parallel_shard_degree", "-1",
                                                  "--parallelism.tensor_parallel_degree", "2",
                                                  "--parallelism.expert_parallel_degree", str(ep)],
         "min_gpus": 4},
    ]


def run_torchrun_row(ctx: PhaseContext, row: dict[str, Any], *, ngpu: int) -> dict[str, Any]:
    record = {"name": row["name"], "command": " ".join(row["command"])}
    if ngpu == 0:
        return {**record, "status": "SKIPPED", "error": "0 GPUs on this machine (nvidia-smi -L)", "root_cause": ""}
    if ngpu < row["min_gpus"]:
        return {**record, "status": "FAIL", "error": f"needs >= {row['min_gpus']} GPUs, this machine has {ngpu}",
                "root_cause": "hardware"}
    ctx.progress(f"torchrun {row['name']} on {ngpu} GPU(s)")
    done = subprocess.run(row["command"], cwd=ctx.target, capture_output=True, text=True, timeout=3600)
    name = ctx.write_artifact(f"parallelism/{row['name']}.log", done.stdout + done.stderr)
    tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
    return {**record, "status": "PASS" if done.returncode == 0 else "FAIL", "log": name,
            "error": "" if done.returncode == 0 else " | ".join(tail), "root_cause": ""}
