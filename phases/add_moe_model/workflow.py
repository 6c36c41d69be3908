"""add-moe-model: port a Hugging Face MoE model into torchtitan's transformers backend.

The whole skill as one table: pre-flight -> probe -> synthetic config -> numerics ->
(gap analysis when numerics is WARN or FAIL) -> parallelism -> compatibility doc -> commit.
Guards hold at every advance: permanent edits only inside the experiment folder (open
temporary patches of the gap analysis excepted) and no forward hooks or
``parallelize_module`` added there. Core patches go through the engine's ledger only.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.jobs import JOB, JobRecord
from orchestrator.ledger import PatchRefused, patch_row
from orchestrator.workflow import PhaseSpec, Workflow
from phases.add_moe_model import preflight, rules
from phases.add_moe_model.parallelism import ROW_KIND
from phases.add_moe_model.records import (CommitRecord, GapAnalysis, GapRow, NeEntryWritten, Numerics, Parallelism,
                                          Preflight, Probe, Remeasure, Synthetic, TorchrunRow, TreeScriptRecord)
from phases.add_moe_model.work.pretrained import PretrainedResult
from phases.add_moe_model.start import prepare
from phases.add_moe_model.workspace import EXP

# The experiment folder changed after numerics measured it (measured_tree): measure it again before the doc or commit.
REMEASURE = {"remeasure": "numerics"}

NOTES = {
    "probe": "Fix every fixable issue inside the experiment folder (state_dict_adapter.py, moe_replacement.py, "
             "hf_sharding.py, model.py), then advance: the probe re-runs on your edited checkout. Do not ask about "
             "what you can fix; do not edit core (torchtitan/models, distributed, components). A finding whose cause "
             "no edit there can remove (a core feature Titan lacks, transformers, the config): escalate with the "
             "evidence, and a person waives it or aborts.",
    "synthetic_config": "The entry keeps the real hidden/intermediate/moe sizes, 8 experts, top-2, vocab 256, "
                        "max_position_embeddings 64, sdpa, use_cache False, heads dividing hidden.",
    "numerics": "HF is the gold standard: never patch HF modules, never loosen thresholds (PASS KL<1e-6, WARN<1e-3). "
                "Fix what a finding's fix_location puts in the experiment folder (the file of the frame that raised; "
                "shape mismatch or dropped keys -> adapter; grouped_mm RuntimeError -> expert weight shapes; FAIL -> "
                "routing or transfer). An error raised in transformers or torchtitan core, or a SKIP, waits for a "
                "person.",
    "gap_analysis": "Fully automatic, no questions. Temporary core patches only through submit kind=patch (one at a "
                    "time, each measured); every patch is reverted with proof before the phase passes.",
    "parallelism": "TP sharding only via _sharding_config (colwise_config / rowwise_config / _replicate_config); "
                   "no forward hooks, no parallelize_module, no redundant-compute TP.",
}


class Options(BaseModel):
    """``orchestrator start add-moe-model --model MODEL [...]``."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1, max_length=1024)
    """Registry id (e.g. Qwen/Qwen3-30B-A3B), a config.json or its directory, or type:<model_type>."""
    target: str = "embedded"
    """"embedded" (a workspace made from the installed torchtitan) or a torchtitan git checkout."""
    branch: str | None = Field(default=None, pattern=r"^(current|new(:[A-Za-z0-9._/-]+)?)$")
    commit: Literal["auto", "never"] | None = None
    unrun_rows: Literal["accept"] | None = None
    """A person's answer, ahead of time, to the parallelism question about torchrun rows this machine
    cannot run (e.g. no GPU): accept them as unrun. Left out, the run asks when it gets there."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    torchrun_rows: Literal["run", "skip"] = "run"
    """``skip`` (the survey's setting): the parallelism phase runs its build check only and leaves every
    torchrun row UNRUN, saying so; ``run`` runs each row the visible GPUs allow."""
    weights: str | None = Field(default=None, min_length=1, max_length=4096)
    """A local Hugging Face checkpoint directory (config.json + *.safetensors) of the same model type: the
    numerics phase also runs the skill's pretrained test (Phase 3b, PASS below KL 1e-3) on it."""
    python: str | None = None
    """Interpreter of the target's environment (default: this one)."""
    executor: Literal["local", "slurm"] = "local"
    """Where the parallelism rows this machine cannot run go: ``slurm`` submits each as a cluster job."""
    slurm_partition: str | None = None
    """SLURM settings (else ORCHESTRATOR_SLURM_PARTITION, _ACCOUNT, _TIME, _SBATCH_ARGS; else the cluster's
    defaults); recorded at start, checked with ``sbatch --test-only``."""
    slurm_account: str | None = None
    slurm_time: str | None = None
    slurm_sbatch_args: str | None = None


WORKFLOW = Workflow(
    name="add-moe-model",
    description="Add a Hugging Face MoE model to torchtitan's transformers modeling backend",
    templates="add_moe_model",
    phases=(
        PhaseSpec(name="preflight", module="phases.add_moe_model.preflight", title="branch and commit choice",
                  returns=Preflight, asks=preflight.QUESTIONS),
        PhaseSpec(name="probe", module="phases.add_moe_model.probe", title="compatibility probe (meta device)",
                  gates=("preflight_answered",), allowed_paths=(EXP,), agent_notes=NOTES["probe"], returns=Probe),
        PhaseSpec(name="synthetic_config", module="phases.add_moe_model.synthetic_config",
                  title="synthetic test config", gates=("probe_clean",), allowed_paths=(EXP,),
                  agent_notes=NOTES["synthetic_config"], returns=Synthetic),
        PhaseSpec(name="numerics", module="phases.add_moe_model.numerics", title="numerical equivalence",
                  routes={"pass": "parallelism", "gap": "gap_analysis"}, allowed_paths=(EXP,),
                  agent_notes=NOTES["numerics"], returns=Numerics),
        PhaseSpec(name="gap_analysis", module="phases.add_moe_model.gap_analysis",
                  title="numerical gap analysis (temporary core patches)", agent_notes=NOTES["gap_analysis"],
                  returns=GapAnalysis),
        PhaseSpec(name="parallelism", module="phases.add_moe_model.parallelism", title="parallelism checks",
                  gates=("no_open_patches",), allowed_paths=(EXP,), agent_notes=NOTES["parallelism"],
                  results="phases.add_moe_model.parallelism:take_results", returns=Parallelism),
        PhaseSpec(name="compat_doc", module="phases.add_moe_model.compat_doc", title="MODEL_COMPATIBILITY.md",
                  gates=("no_open_patches",), routes=REMEASURE),
        PhaseSpec(name="commit", module="phases.add_moe_model.commit", title="lint and commit",
                  gates=("no_open_patches",), routes=REMEASURE),
    ),
    options=Options,
    prepare=prepare,
    gates={"preflight_answered": rules.preflight_answered, "probe_clean": rules.probe_clean,
           "no_open_patches": rules.no_open_patches},
    guards={"scope": rules.scope_guard, "forbidden_calls": rules.forbidden_calls_guard,
            "frozen_thresholds": rules.frozen_thresholds_guard},
    rules={"commit_inside_scope": rules.commit_inside_scope, "no_questions_in_gap_analysis": rules.no_questions_in_gap,
           "numerics_tier_matches_kl": rules.numerics_tier_matches_kl,
           "parallelism_rows_accounted": rules.parallelism_rows_accounted},
    scope=(EXP,),
    frozen=rules.FROZEN,
    records={"gap_row": GapRow, "commit": CommitRecord, "ne_entry_written": NeEntryWritten,
             "tree_script_verdict": TreeScriptRecord, "pretrained_verdict": PretrainedResult, "remeasure": Remeasure,
             ROW_KIND: TorchrunRow, "patch_refused": PatchRefused, JOB: JobRecord},
    submissions={"patch": patch_row("gap_analysis", check="phases.add_moe_model.gap_analysis:take_patch")},
    human_options=("branch", "commit", "unrun_rows"),
)
