"""The skill's torchrun matrix (Phase 4) as rows: their commands, and reading a row's log.

Rows (``config``, ``world_size``, ``tp``, ``ep``):
- ``FSDP-1gpu``: FSDP on one GPU, the minimum viable test (world size 1);
- ``FSDP``, ``FSDP+EP``: on every visible GPU (at least 2);
- ``FSDP+TP+EP``: TP 2 on at least 4 GPUs.
EP borrows its ranks from the FSDP x TP product; it adds none.

Commands are the skill's with the slip fixed: torchrun takes ``-m`` for the trainer module
(``torchtitan.train``, here behind ``trainer_launch`` which applies the torch compat layer
first) and ``--module transformers_modeling_backend`` belongs to the trainer. ``--hf_model``
is the run's local config directory, and the tokenizer, the c4_test-like data set and the
dump folder are run-local paths, so a command runs as written with no hub and no checkout
assets. No torch here: the engine process imports this module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONFIG = "transformers_modeling_backend_debugmodel_moe"
LAUNCHER = "phases.add_moe_model.work.trainer_launch"
STEPS = 2
SEQ_LEN = 64
"""The synthetic config's max_position_embeddings."""
ROOT_CAUSE_TORCH = "torch"


@dataclass(frozen=True, kw_only=True, slots=True)
class Row:
    config: str
    world_size: int
    tp: int = 1
    ep: int = 1

    @property
    def slug(self) -> str:
        return self.config.replace("+", "_")


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainerPaths:
    """Where a command finds its inputs; absolute paths (or ``$VAR`` references in a job script)."""

    hf_config: str
    tokenizer: str
    dataset: str
    dump: str


def matrix(ngpu: int) -> list[Row]:
    many = max(ngpu, 2)
    wide = max(ngpu, 4)
    return [
        Row(config="FSDP-1gpu", world_size=1),
        Row(config="FSDP", world_size=many),
        Row(config="FSDP+EP", world_size=many, ep=max(2, many // 2)),
        Row(config="FSDP+TP+EP", world_size=wide, tp=2, ep=wide // 2),
    ]


def trainer_command(row: Row, paths: TrainerPaths, *, python: str = "python") -> list[str]:
    """``torchrun`` (as ``python -m torch.distributed.run``) of one row, runnable as written."""
    command = [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={row.world_size}",
               "-m", LAUNCHER, "--module", "transformers_modeling_backend", "--config", CONFIG,
               "--hf_model", paths.hf_config, "--hf_assets_path", paths.tokenizer,
               "--dataloader.dataset_path", paths.dataset, "--dump_folder", f"{paths.dump}/{row.slug}",
               "--training.steps", str(STEPS), "--training.seq_len", str(SEQ_LEN)]
    if row.world_size > 1:
        command += ["--parallelism.data_parallel_shard_degree", "-1"]
    if row.tp > 1:
        command += ["--parallelism.tensor_parallel_degree", str(row.tp)]
    if row.ep > 1:
        command += ["--parallelism.expert_parallel_degree", str(row.ep)]
    return command


def torch_root_cause(fsdp: dict[str, Any] | None) -> str:
    """The root cause of a world-size > 1 row on a torch whose FSDP cannot shard plain parameters."""
    seen = (f"torch {fsdp['torch']}: " if fsdp else "torch: ") + "fully_shard cannot shard torchtitan's spmd_types " \
        "plain parameters at world size > 1"
    probe = f" (probe on a 2-rank fake mesh: {fsdp['error']})" if fsdp else ""
    return (seen + probe + "; torchtitan's FSDP needs torch >= 2.14 (its stated requirement, not measured here), "
            "outside the experiment folder")


# (pattern in the log, root cause, fixable in the experiment folder)
SIGNATURES: tuple[tuple[str, str, bool], ...] = (
    (r"unexpected keyword argument 'dp_mesh_dims'|all parameters must be DTensors", ROOT_CAUSE_TORCH, False),
    (r"No module named '?transformers_modeling_backend'?", "command: torchrun's --module is a flag; the trainer "
     "is -m torchtitan.train with --module transformers_modeling_backend", False),
    (r"_cuda_setDevice|No CUDA GPUs are available|Found no NVIDIA driver", "no usable GPU in this process", False),
    (r"CUDA out of memory|OutOfMemoryError", "GPU memory", False),
    (r"Unsharded modules with no _sharding_config", "module without a sharding config (hf_sharding.py)", True),
    (r"mixed torch.Tensor and DTensor|DTensor.*and.*torch.Tensor", "mixed DTensor / plain tensor "
     "(_replicate_config in hf_sharding.py)", True),
)


MISSING_MODULE = re.compile(r"No module named '([\w.]+)'")


def diagnose(log: str, fsdp: dict[str, Any] | None, *, target: Path | None = None) -> tuple[str, bool]:
    """(root cause, fixable in the experiment folder) of a failed row's log; unknown -> fixable."""
    for pattern, cause, fixable in SIGNATURES:
        if re.search(pattern, log):
            return (torch_root_cause(fsdp) if cause == ROOT_CAUSE_TORCH else cause), fixable
    missing = MISSING_MODULE.search(log)
    if missing:
        return missing_module_cause(missing[1], target), False
    return "undiagnosed: read the log, fix in the experiment folder or name the cause", True


def missing_module_cause(module: str, target: Path | None) -> str:
    """The module the trainer's Python lacks and the package to install (the target's pin when it has one)."""
    top = module.split(".")[0]
    pin = _pinned_requirement(top, target) if target else None
    install = (f"pip install '{pin}' (pinned in the target's pyproject.toml)" if pin
               else f"pip install {top} (the package named after the module; the target pins none)")
    return f"missing Python module '{module}' in the trainer's environment: {install}"


def _pinned_requirement(top: str, target: Path) -> str | None:
    import tomllib

    try:
        project = tomllib.loads((target / "pyproject.toml").read_text()).get("project", {})
    except (OSError, ValueError):
        return None
    wanted = top.lower().replace("_", "-")
    for requirement in project.get("dependencies", []):
        name = re.split(r"[\s<>=!~\[;]", requirement, maxsplit=1)[0]
        if name.lower().replace("_", "-") == wanted:
            return requirement
    return None


EXCEPTION_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?((?:\w+\.)*\w*(?:Error|Exception)\b.*)$")


def error_excerpt(log: str) -> str:
    """The last exception line of the log (rank prefix dropped), else its last three lines."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    errors = [m.group(1) for m in map(EXCEPTION_LINE.match, lines) if m]
    return " | ".join(errors[-1:] or lines[-3:])[:600]


STEP_LINE = re.compile(r"step:\s*(\d+)\s+loss:\s*([-+0-9.eE]+|nan|inf)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def trained_steps(log: str) -> list[dict[str, Any]]:
    """The trainer's ``step: N loss: X`` lines (first rank that logs them), colour codes dropped."""
    steps = {}
    for match in STEP_LINE.finditer(ANSI.sub("", log)):
        steps.setdefault(int(match.group(1)), match.group(2))
    return [{"step": step, "loss": loss} for step, loss in sorted(steps.items())]


def row_from_run(row: Row, *, command: str, returncode: int, log: str, log_name: str,
                 fsdp: dict[str, Any] | None, target: Path | None = None) -> dict[str, Any]:
    """A finished row: PASS on exit 0 with every step's loss logged, else FAIL with a diagnosed root cause."""
    from phases.add_moe_model.work.torch_compat import parse_announcements

    record = {**base_record(row, command), "ran": True, "returncode": returncode, "log": log_name,
              "torch_compat": parse_announcements(log)[:1], "steps": trained_steps(log)}
    if returncode == 0 and len(record["steps"]) >= STEPS:
        return {**record, "status": "PASS"}
    if returncode == 0:
        return {**record, "status": "FAIL", "error": f"exit 0 but {len(record['steps'])} of {STEPS} training steps "
                "logged", "root_cause": "undiagnosed: the trainer did not train", "fixable": True}
    cause, fixable = diagnose(log, fsdp, target=target)
    return {**record, "status": "FAIL", "error": error_excerpt(log), "root_cause": cause, "fixable": fixable}


def base_record(row: Row, command: str) -> dict[str, Any]:
    return {"config": row.config, "world_size": row.world_size, "tp": row.tp, "ep": row.ep, "command": command,
            "status": "", "error": "", "root_cause": "", "log": None, "ran": False}
