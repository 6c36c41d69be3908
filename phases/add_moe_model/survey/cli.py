"""``orchestrator survey add-moe-model [--models all|TYPE,...] [--target embedded|PATH] [--device ...]
[--out DIR]``: the survey command (a plugin of the orchestrator CLI)."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Callable

import click

_TYPE = re.compile(r"^[a-z0-9_][a-z0-9_-]*$")


def register(main: click.Group, command: Callable[..., Any]) -> None:
    """Add ``survey add-moe-model`` (and the ``survey`` group when no other plugin made it)."""
    group = main.commands.get("survey")
    if group is None:
        @main.group("survey")
        def group() -> None:
            """Run a workflow over many models, one run each, and report a verdict per model."""

    @command(group, "add-moe-model")
    @click.option("--models", default="all", show_default=True, help="all, or model types: qwen3_moe,olmoe")
    @click.option("--target", default="embedded", show_default=True, help="embedded, or a torchtitan checkout")
    @click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
    @click.option("--out", metavar="DIR", help="Reports (default STATE_DIR/surveys/add-moe-model-TARGET).")
    @click.option("--executor", type=click.Choice(["local", "slurm"]), default="local", show_default=True,
                  help="slurm: the model types as one job array (docs/slurm.md); run again to collect.")
    @click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True,
                  help="Local processes side by side, one warm worker each (local executor).")
    @click.option("--tasks", type=click.IntRange(min=1), default=8, show_default=True, help="Array tasks (slurm).")
    @click.option("--slurm-partition", default=None)
    @click.option("--slurm-account", default=None)
    @click.option("--slurm-time", default=None)
    @click.option("--slurm-sbatch-args", default=None)
    def survey_cmd(settings: Any, models: str, target: str, device: str, out: str | None, executor: str, jobs: int,
                   tasks: int, **slurm: str | None) -> int:
        """Survey MoE model types: one add-moe-model run each (never a commit), one outcome each."""
        from phases.add_moe_model.survey.report import write_reports
        from phases.add_moe_model.survey.runner import SurveyOptions, run_survey

        opts = SurveyOptions(models=parse_models(models), target=check_target(target), device=device,
                             out=Path(out) if out else default_out(settings.state_dir, target),
                             state_dir=settings.state_dir)
        say = (lambda _m: None) if settings.as_json else (lambda m: print(f"... {m}", file=sys.stderr, flush=True))
        if executor == "slurm":
            survey = run_on_slurm(opts, tasks, slurm, say=say)
        else:
            survey = run_survey(opts, say=say) if jobs == 1 else run_side_by_side(opts, jobs, say=say)
        if isinstance(survey, str):  # the job array still runs: run the same command again later
            if settings.as_json:
                from orchestrator.render import emit_json

                emit_json({"waiting": survey, "out": str(opts.out)})
            else:
                print(survey, file=sys.stderr)
            return 5
        paths = write_reports(survey, opts)
        if settings.as_json:
            from orchestrator.render import emit_json

            emit_json({"rows": [r.model_dump(exclude={"seconds"}) for r in survey.rows], "counts": survey.counts,
                       "out": str(opts.out), "seconds": survey.seconds, "transformers": survey.transformers})
        else:
            print(paths["SURVEY.md"].read_text())
            print(f"reports: {', '.join(str(p) for p in paths.values())}", file=sys.stderr)
        return 1 if survey.counts["error"] else 0


def parse_models(text: str) -> tuple[str, ...] | None:
    from orchestrator.errors import UsageError

    if text.strip() == "all":
        return None
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    bad = [n for n in names if not _TYPE.match(n)]
    if not names or bad:
        raise UsageError(f"--models takes 'all' or model types separated by commas (e.g. qwen3_moe,olmoe); "
                         f"got {text!r}")
    return names


def check_target(target: str) -> str:
    from orchestrator.errors import UsageError

    if target != "embedded" and not Path(target).expanduser().is_dir():
        raise UsageError(f"--target {target!r} is neither 'embedded' nor a directory")
    return target


def default_out(state_dir: Path, target: str) -> Path:
    name = "embedded" if target == "embedded" else re.sub(r"[^A-Za-z0-9._-]+", "-", str(Path(target).resolve()))
    return state_dir / "surveys" / f"add-moe-model-{name.strip('-')}"


def run_side_by_side(opts: Any, jobs: int, *, say: Callable[[str], None]) -> Any:
    from phases.add_moe_model.survey.parallel import run_jobs

    return run_jobs(opts, models_to_fan_out(opts), jobs=jobs, say=say)


def models_to_fan_out(opts: Any) -> list[str]:
    """The model types a fanned-out survey splits; the pristine workspace is made here once, not by each task."""
    from orchestrator.trail.store import RunStore
    from phases.add_moe_model.survey.runner import discover, warm_root

    RunStore(opts.state_dir).ensure_writable()
    root = warm_root(opts.target, opts.state_dir)
    models = list(opts.models) if opts.models else [m["model_type"] for m in discover(root)["models"]]
    opts.out.mkdir(parents=True, exist_ok=True)
    return models


def run_on_slurm(opts: Any, tasks: int, slurm: dict[str, str | None], *, say: Callable[[str], None]) -> Any:
    """Check the cluster (exit 2 on refusal), then submit, poll or merge the survey's job array."""
    from orchestrator import cluster
    from phases.add_moe_model.survey.array import run_array

    settings = cluster.settings_from(slurm)
    cluster.check_ready(settings)
    return run_array(opts, models_to_fan_out(opts), tasks=tasks, settings=settings, say=say)
