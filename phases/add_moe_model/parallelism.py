"""Phase 4: parallelism (skill A.5): the torchrun matrix, run where it can, every row accounted for.

1. The sharding build check at world sizes 2, 4 and 8 on meta with a fake process group
   (``work/build_check``): a module without a sharding config is the agent's to fix.
2. The trainer's inputs, made locally (``work/trainer_assets``): the synthetic config as a
   local HF directory, a small tokenizer and a c4_test-like data set, kept as artifacts under
   ``trainer/``; the same worker reports the torch compat pieces this environment needs and
   whether its FSDP can shard at world size > 1 (both recorded as notes).
3. Each row of ``parallel_matrix.matrix`` (``config, world_size, tp, ep, command, status,
   error, root_cause, log``), in ``artifacts/parallelism.json`` and the report ``parallelism.md``:
   - runs when the visible GPUs allow it: PASS on exit 0, else FAIL with the log's error
     and a diagnosed root cause (an undiagnosed or experiment-code cause is the agent's);
   - cannot run here and the torch probe already fails: FAIL with the torch root cause;
   - cannot run here, ``--executor slurm``: one cluster job each (``parallel_jobs``), WAITING
     until the engine sees it end and hands its logs back through ``take_results``;
   - cannot run here otherwise: UNRUN. Never PASS, never dropped: the phase asks a human to
     run ``parallelism/sbatch.sh`` elsewhere and hand the logs back
     (``orchestrator resume RUN --results DIR``, read by ``take_results``), or to accept the
     unrun rows (``--answer unrun_rows=accept``).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from orchestrator.errors import UsageError
from orchestrator.phase_api import HandBack, Issue, PhaseContext, PhaseResult, Question
from orchestrator.workflow import load_workflow
from phases.add_moe_model.parallel_matrix import (
    Row, TrainerPaths, base_record, matrix, row_from_run, torch_root_cause, trainer_command,
)
from phases.add_moe_model.parallel_jobs import WAITING, job_row, waiting_summary
from phases.add_moe_model.error_triage import NOT_THE_AGENTS, frame_file, in_experiment
from phases.add_moe_model.model_source import model_name
from phases.add_moe_model.layer_table import kinds_of_layers, synthetic_layers
from phases.add_moe_model.records import Parallelism, Results, Synthetic, TorchrunRow
from phases.add_moe_model.workers import ASSETS, BUILD_CHECK

SKILL_FEEDBACK = (
    "Phase 4 commands: `torchrun --nproc-per-node N --module transformers_modeling_backend ...` fails with "
    "\"No module named transformers_modeling_backend\": torchrun's --module is its own flag (run a module). The "
    "trainer is `torchrun --nproc-per-node N -m torchtitan.train --module transformers_modeling_backend --config "
    "transformers_modeling_backend_debugmodel_moe ...`.",
    "Phase 4 inputs: `--hf_model <hub id>` needs the hub, and the debug config reads ./tests/assets/tokenizer and "
    "the c4_test data set from a torchtitan source checkout. Offline, or from a wheel: --hf_model LOCAL_CONFIG_DIR "
    "--hf_assets_path TOKENIZER_DIR --dataloader.dataset_path DATA_DIR.",
    "Phase 4 sequence length: the debug config's --training.seq_len 2048 exceeds the Phase 2 synthetic config's "
    "max_position_embeddings 64; pass --training.seq_len 64.",
)
ROW_KIND = "parallelism_row"
ROW_TIMEOUT_S = 600
QUESTION_KEY = "unrun_rows"
SKIPPED = "not run: --torchrun-rows skip (build check only; `orchestrator run` runs the rows)"


def run(ctx: PhaseContext) -> PhaseResult:
    asked = rows_asked_about(ctx)
    if asked is not None:
        ctx.plan(0)
        ctx.progress("unrun rows accepted: the build check and rows the question was asked about stand "
                     "(the target is unchanged since)")
        return outcome(ctx, asked)
    entry = ctx.result("synthetic_config", Synthetic).entry
    request = {"model_type": entry["model_type"], "config_kwargs": entry}
    ctx.plan(2)  # the build check and the trainer assets; the torchrun rows this machine runs are known after them
    checks = ctx.call(BUILD_CHECK, request, label="sharding build check").model_dump()["results"]
    for check in checks:
        if declared_unsupported(check):
            check["status"] = "UNSUPPORTED"
    assets = ctx.call(ASSETS, request, label="trainer assets").model_dump()
    paths = write_assets(ctx, assets["files"])
    record_environment(ctx, assets)
    record_skill_feedback(ctx)
    ngpu, fsdp = assets["cuda_devices"], assets["fsdp"]
    python = ctx.options.get("python") or sys.executable
    handed = handed_back_rows(ctx)
    ctx.plan(2 + sum(runs_here(ctx, row, ngpu) for row in matrix(ngpu) if row.config not in handed))
    rows = [handed.get(row.config) or settle_row(ctx, row, paths, python=python, ngpu=ngpu, fsdp=fsdp)
            for row in matrix(ngpu)]
    ctx.write_artifact("parallelism.json", json.dumps({"gpus": ngpu, "fsdp": fsdp, "rows": rows}, indent=2) + "\n")
    ctx.write_artifact("parallelism/sbatch.sh", job_script(ctx, paths, matrix(ngpu), python=python))
    ctx.write_artifact("parallelism.md", ctx.render("parallelism_report.md.j2",
                                                    model_name=model_name(dict(ctx.options)),
                                                    gpus=ngpu, fsdp=fsdp, compat=assets["compat"], rows=rows))
    data = {"build_check": checks, "rows": rows, "gpus": ngpu, "fsdp": fsdp, "torch_compat": assets["compat"],
            "tree": tree_state(ctx.target)}
    return outcome(ctx, data)


def rows_asked_about(ctx: PhaseContext) -> dict[str, Any] | None:
    """The last attempt's data, when a human has just accepted its unrun rows and the target has not changed
    since: answering the question needs no second build check nor second pass over the rows."""
    last = ctx.result("parallelism", Parallelism) if "parallelism" in ctx.results else None
    if ctx.answers.get(QUESTION_KEY) != "accept" or last is None or not last.rows or last.tree is None:
        return None
    return last.model_dump(mode="json", exclude_unset=True) if last.tree == tree_state(ctx.target) else None


def tree_state(target: Path) -> dict[str, Any]:
    """The target's commit and working-tree status (what the build check and the rows ran on)."""
    from orchestrator.git import capture_base

    base = capture_base(target)
    return {"commit": base["commit"], "status": base["status"]}


def write_assets(ctx: PhaseContext, files: dict[str, str]) -> TrainerPaths:
    for name, text in sorted(files.items()):
        ctx.write_artifact(f"trainer/{name}", text)
    root = ctx.artifacts_dir / "trainer"
    return TrainerPaths(hf_config=str(root / "hf_config"), tokenizer=str(root / "tokenizer"),
                        dataset=str(root / "c4_test"), dump=str(ctx.artifacts_dir.parent / "trainer_out"))


def record_environment(ctx: PhaseContext, assets: dict[str, Any]) -> None:
    compat, fsdp = assets["compat"], assets["fsdp"]
    if compat["applied"]:
        ctx.note(f"torch {compat['torch']}: compat pieces applied before torchtitan was imported: "
                 + ", ".join(compat["applied"]), kind="torch_compat")
    ctx.note(f"torch {fsdp['torch']}: FSDP at world size > 1 "
             + ("works on the probe" if fsdp["ok"] else f"fails on the probe: {fsdp['error']}"), kind="capability")


def record_skill_feedback(ctx: PhaseContext) -> None:
    """What the skill's Phase 4 text gets wrong, once per run (notes) and as ``skill_feedback.md``."""
    if ctx.attempt <= 1:
        for line in SKILL_FEEDBACK:
            ctx.note(line, kind="skill_feedback")
    ctx.write_artifact("skill_feedback.md", "# Skill feedback (add-moe-model)\n\n"
                       + "".join(f"- {line}\n" for line in SKILL_FEEDBACK))


def settle_row(ctx: PhaseContext, row: Row, paths: TrainerPaths, *, python: str, ngpu: int,
               fsdp: dict[str, Any]) -> dict[str, Any]:
    command = trainer_command(row, paths, python=python)
    shown = shlex.join(command)
    if ctx.options.get("torchrun_rows") == "skip":
        return {**base_record(row, shown), "status": "UNRUN", "error": SKIPPED, "root_cause": ""}
    if runs_here(ctx, row, ngpu):
        return run_row(ctx, row, command, fsdp=fsdp)
    where = f"needs {row.world_size} GPU(s), this machine has {ngpu}"
    if row.world_size > 1 and not fsdp["ok"]:
        return {**base_record(row, shown), "status": "FAIL", "error": f"not run here ({where}); "
                f"the FSDP probe fails: {fsdp['error']}", "root_cause": torch_root_cause(fsdp), "fixable": False}
    if ctx.options.get("executor") == "slurm":
        return job_row(ctx, row, shown, script=lambda: job_script(ctx, paths, [row], python=python))
    return {**base_record(row, shown), "status": "UNRUN", "error": where, "root_cause": ""}


def runs_here(ctx: PhaseContext, row: Row, ngpu: int) -> bool:
    """Whether this machine runs ``row`` now (a step of the phase)."""
    return ctx.options.get("torchrun_rows") != "skip" and row.world_size <= ngpu


def run_row(ctx: PhaseContext, row: Row, command: list[str], *, fsdp: dict[str, Any]) -> dict[str, Any]:
    from orchestrator.worker import worker_env

    with ctx.step(f"torchrun {row.config} on {row.world_size} GPU(s)"):
        try:
            done = subprocess.run(command, cwd=ctx.target, env=worker_env(ctx.target), capture_output=True,
                                  text=True, timeout=ROW_TIMEOUT_S)
            returncode, log = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as exc:
            returncode, log = 124, f"{exc.stdout or ''}{exc.stderr or ''}\nTIMEOUT after {ROW_TIMEOUT_S} s\n"
    name = ctx.write_artifact(f"parallelism/{row.slug}.log", log)
    return row_from_run(row, command=shlex.join(command), returncode=returncode, log=log, log_name=name, fsdp=fsdp,
                        target=Path(ctx.target))


def handed_back_rows(ctx: PhaseContext) -> dict[str, dict[str, Any]]:
    """The latest handed-back record of each config (``take_results`` wrote them), as the rows' dicts."""
    return {r.config: r.model_dump(mode="json", exclude_unset=True) for r in ctx.records(TorchrunRow)}


def outcome(ctx: PhaseContext, data: dict[str, Any]) -> PhaseResult:
    rows = data["rows"]
    unsupported = [str(r["world_size"]) for r in data["build_check"] if r["status"] == "UNSUPPORTED"]
    said = f" (world {', '.join(unsupported)}: the target declares the layout unsupported)" if unsupported else ""
    results = Results.model_validate(ctx.results)
    kinds = len(synthetic_layers(results.synthetic_config))
    over = f" over the synthetic entry's {kinds} layer kind{'s' if kinds != 1 else ''}" if kinds else ""
    summary = (f"build check {sum(r['status'] == 'PASS' for r in data['build_check'])}/{len(data['build_check'])} "
               f"PASS{over}{said}; torchrun: " + ", ".join(f"{r['config']} {r['status']}" for r in rows))
    unknown = [Issue(code="unknown_target_api", message=f"world {r['world_size']}: {r['error']}",
                     fix_location="phases/add_moe_model/work/build_check.py (the workflow's worker; the target "
                                  "is not at fault)") for r in data["build_check"] if unknown_api(r)]
    if unknown:
        return PhaseResult(outcome="failed", summary=summary, data=data, issues=tuple(unknown))
    if any(r["status"] == WAITING for r in rows):
        return PhaseResult(outcome="waiting_job", summary=waiting_summary(rows), data=data)
    issues = [build_check_issue(r, kinds=kinds_of_layers(results, r.get("failed_layers") or []))
              for r in data["build_check"] if r["status"] == "FAIL"]
    issues += [Issue(code="torchrun_failed", message=f"{r['config']}: {r['error']} (root cause: {r['root_cause']})",
                     fix_location="experiment code (see the row's log)")
               for r in rows if r["status"] == "FAIL" and r.get("fixable")]
    if any(i.code in NOT_THE_AGENTS for i in issues):
        return PhaseResult(outcome="needs_human", summary=summary, data=data, issues=tuple(issues))
    if issues:
        return PhaseResult(outcome="needs_agent", summary=summary, data=data, issues=tuple(issues))
    unrun = [r for r in rows if r["status"] == "UNRUN"]
    if unrun and ctx.answers.get(QUESTION_KEY) != "accept":
        return PhaseResult(outcome="needs_human", summary=summary + f"; {len(unrun)} row(s) unrun", data=data,
                           questions=(unrun_question(ctx.run_id, unrun),))
    return PhaseResult(outcome="passed", summary=summary, data=data)


def build_check_issue(r: dict[str, Any], *, kinds: str = "") -> Issue:
    """A failed world size, named for whose code failed (the sharding configs, or the frame that raised) and for
    the layer kinds it failed on (``kinds``: layer_table.kinds_of_layers)."""
    on = f" [failed on {kinds}]" if kinds else ""
    head = f"world {r['world_size']} (tp={r['tp']}, ep={r['ep']}){on}: {r['error'] or ''}"
    frame = r.get("error_frame")
    if r["unsharded_modules"] or not frame:
        return Issue(code="module_without_sharding_config",
                     message=f"{head} unsharded: {', '.join(r['unsharded_modules']) or '-'}",
                     fix_location="hf_sharding.py (_set_layer_sharding_configs / set_hf_sharding_configs)")
    if in_experiment(frame):
        return Issue(code="build_check_error", message=head,
                     fix_location=f"{frame_file(frame)} ({frame}), in the experiment folder")
    if r.get("error_origin") == "transformers":
        return Issue(code="raised_in_transformers", message=head,
                     fix_location=f"transformers ({frame}): a person waives with a reason or aborts")
    if r.get("error_origin") == "target":
        return Issue(code="raised_in_torchtitan_core", message=head,
                     fix_location=f"{frame_file(frame)} ({frame}), torchtitan's own code outside the experiment "
                                  "folder: a person waives with a reason, fixes core, or aborts")
    return Issue(code="build_check_error", message=head,
                 fix_location=f"the frame named in the error ({frame}); whose code it is was not determined")


def declared_unsupported(row: dict[str, Any]) -> bool:
    """The target's own sharding code raised NotImplementedError: a limitation it states, not a bug to fix.

    e.g. main's hf_sharding refuses TP for GLM-5's DSA indexer; its parallelism table lists FSDP/EP only.
    """
    return row["status"] == "FAIL" and (row.get("error") or "").startswith("NotImplementedError")


def unknown_api(row: dict[str, Any]) -> bool:
    return (row.get("error") or "").startswith("UnknownTargetApi")


def unrun_question(run_id: str, unrun: list[dict[str, Any]]) -> Question:
    listed = "; ".join(f"{r['config']} ({r['error']})" for r in unrun)
    return Question(key=QUESTION_KEY, choices=("accept", "handed-back"), prompt=(
        f"Unrun here: {listed}. Run artifacts/parallelism/sbatch.sh on a machine with enough GPUs, then "
        f"`orchestrator resume {run_id} --results DIR` (DIR holds its <config>.log and <config>.rc files), "
        "or accept the rows as unrun with --answer unrun_rows=accept."))


def job_script(ctx: PhaseContext, paths: TrainerPaths, rows: list[Row], *, python: str) -> str:
    """The run's rows as one job for one node; paths are variables a user may point elsewhere."""
    from orchestrator.worker import PROJECT_ROOT

    variables = TrainerPaths(hf_config="$ASSETS/hf_config", tokenizer="$ASSETS/tokenizer", dataset="$ASSETS/c4_test",
                             dump="$RESULTS/dump")
    rows = [{"config": r.config, "slug": r.slug, "world_size": r.world_size,
             "command": shell_words(trainer_command(r, variables, python="$PYTHON"))} for r in rows]
    return ctx.render("sbatch.sh.j2", rows=rows, gpus=max(r["world_size"] for r in rows),
                      model_name=model_name(dict(ctx.options)), run_id=ctx.run_id,
                      assets=str(Path(paths.hf_config).parent), target=str(ctx.target), project=PROJECT_ROOT,
                      python=python)


def shell_words(command: list[str]) -> str:
    """A command line for a job script: words naming a ``$VARIABLE`` in double quotes, so it expands."""
    return " ".join(f'"{word}"' if "$" in word else shlex.quote(word) for word in command)


def take_results(state: dict[str, Any], directory: Path) -> HandBack:
    """``resume --results DIR``: the job script's ``<slug>.log`` / ``<slug>.rc`` pairs become rows."""
    latest = load_workflow(state["workflow"]).result_in(state, "parallelism")
    previous = {r.config: r for r in (latest.rows if latest else ())}
    if not previous:
        raise UsageError("the parallelism phase has no rows yet; advance the run first")
    artifacts, records = {}, []
    for config, before in previous.items():
        slug = Row(config=config, world_size=before.world_size).slug
        log_path, rc_path = directory / f"{slug}.log", directory / f"{slug}.rc"
        if not (log_path.is_file() and rc_path.is_file()):
            continue
        returncode = parse_returncode(rc_path)
        log = log_path.read_text(errors="replace")
        name = f"parallelism/handed_back/{slug}.log"
        row = Row(config=config, world_size=before.world_size, tp=before.tp, ep=before.ep)
        record = row_from_run(row, command=before.command, returncode=returncode, log=log, log_name=name,
                              fsdp=None, target=Path(state["target"]) if state.get("target") else None)
        artifacts[name] = log
        records.append((ROW_KIND, {**record, "source": f"handed back from {directory}"}))
    if not records:
        wanted = ", ".join(f"{Row(config=c, world_size=1).slug}.log/.rc" for c in previous)
        raise UsageError(f"--results {directory}: no row's log and return code found (looked for {wanted})")
    pending = {q["key"] for q in state.get("pending", [])}
    answers = {QUESTION_KEY: "handed-back"} if QUESTION_KEY in pending else {}
    return HandBack(summary=f"{len(records)} parallelism row(s) handed back from {directory}",
                    artifacts=artifacts, records=tuple(records), answers=answers)


def parse_returncode(path: Path) -> int:
    text = path.read_text().strip()
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"{path}: expected the job's exit status (an integer), found {text[:40]!r}") from None
