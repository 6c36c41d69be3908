"""The skill's failure triage (A.3) for an exception of a numerics worker: whose fix it is, and where.

Whose it is follows the innermost frame outside torch (work/error_origin.py): transformers and torchtitan core
wait for a person, the experiment folder goes to the agent with the file the frame is in, our own code fails.

Both comparisons use it: the synthetic one (``numerics``) and the pretrained one (``pretrained``), which
prefixes the codes with ``pretrained_``. Engine side: no torch here.
"""

from __future__ import annotations

from orchestrator.phase_api import Issue
from phases.add_moe_model.work.error_origin import plumbing_failure
from phases.add_moe_model.workspace import EXP

# The workers meet a target they do not know: a finding that ends the phase, never a triage for the agent.
UNKNOWN_TARGET = {"UnknownMoeLayout": "unknown_moe_layout", "UnknownTargetApi": "unknown_target_api"}
# Our own code or process plumbing failed (a fork that broke CUDA, the firmness measurement): the phase
# fails, so the run ends as an error of ours instead of a finding that blames the experiment folder.
# synthetic_config_missing: the engine ran numerics before Phase 2 left its entry, the workflow's own ordering.
OURS = frozenset({*UNKNOWN_TARGET.values(), "worker_plumbing_error", "firmness_error", "numerics_worker_dropped_keys",
                  "synthetic_config_missing"})

# Findings whose fix is not the agent's: the phase waits for a person (waive with a reason, or abort).
# (raised_in_torchtitan_core: the innermost frame is the target's torchtitan outside the experiment folder;
# no_moe_layer: the synthetic entry and the site search are the orchestrator's, not the experiment folder's.)
NOT_THE_AGENTS = frozenset({"raised_in_transformers", "titan_lacks_converted_keys", "raised_in_torchtitan_core",
                            "no_moe_layer"})


def frame_file(frame: str | None) -> str | None:
    """The file of a "path:line function" frame (error_origin's form), or None without one."""
    return frame.split(":", 1)[0] if frame else None


def in_experiment(frame: str | None) -> bool:
    """Whether the frame is the target's experiment folder (the only place the agent may edit)."""
    return bool(frame) and frame.startswith(EXP)


def triage_error(model_type: str, error_type: str, error: str, *, origin: str | None = None,
                 frame: str | None = None) -> Issue:
    """Map an exception to the skill's fix location (A.3 failure triage), by whose code raised it first."""
    text = error.lower()
    if plumbing_failure(error):
        return Issue(code="worker_plumbing_error", message=f"{model_type}: {error}",
                     fix_location=f"the orchestrator's worker process ({frame or 'no frame'} only met it): "
                                  "not the experiment code")
    if origin == "transformers":
        return Issue(code="raised_in_transformers", message=f"{model_type}: {error}",
                     fix_location=f"transformers ({frame}), HF's own modeling code that the comparison runs "
                                  "unmodified: outside the experiment folder. A person decides: waive with a reason "
                                  "(`orchestrator resume RUN --waive raised_in_transformers --reason TEXT`), report "
                                  "it upstream, or abort")
    if error_type == "ValueError" and ("_probe" in text or "moe_replacement" in text or "_resolve" in text):
        return Issue(code="probe_value_error", message=f"{model_type}: {error}",
                     fix_location=(f"{frame_file(frame)} ({frame}): the target's probe refused the synthetic "
                                   "model's config" if in_experiment(frame)
                                   else "synthetic config entry (Phase 2); probe in moe_replacement.py"))
    if "load_state_dict" in text or "size mismatch" in text:
        return Issue(code="adapter_shape_mismatch", message=f"{model_type}: {error}",
                     fix_location="state_dict_adapter.py")
    if error_type in UNKNOWN_TARGET:
        return Issue(code=UNKNOWN_TARGET[error_type], message=f"{model_type}: {error}",
                     fix_location="phases/add_moe_model/work/layout.py (the workflow's worker does not know "
                                  "this part of the target; the target is not at fault)")
    if "grouped_mm" in text or ("shape" in text and ("experts" in text or "grouped" in text)):
        return Issue(code="grouped_mm_shape_error", message=f"{model_type}: {error}",
                     fix_location="expert weight shapes: layout detection in moe_replacement.py, "
                                  "transpose in state_dict_adapter.py")
    if origin == "target" and frame and not in_experiment(frame):
        return Issue(code="raised_in_torchtitan_core", message=f"{model_type}: {error}",
                     fix_location=f"{frame_file(frame)} ({frame}), torchtitan's own code outside the experiment "
                                  f"folder. Core runs the MoE that {EXP}moe_replacement.py (_probe_hf_moe_block, "
                                  "_build_moe_config) configured, so a wrong value there can surface here (seen: a "
                                  "top_k the routed experts' dispatcher did not share with the router raised "
                                  "IndexError in token_dispatcher.py): a person checks that first, then waives with "
                                  "a reason (`orchestrator resume RUN --waive raised_in_torchtitan_core --reason "
                                  "TEXT`), fixes core, or aborts")
    if in_experiment(frame):
        return Issue(code="numerics_error", message=f"{model_type}: {error}",
                     fix_location=f"{frame_file(frame)} ({frame}), in the experiment folder")
    return Issue(code="numerics_error", message=f"{model_type}: {error}",
                 fix_location=f"the frame named in the error ({frame or 'no frame recorded'}); whose code it is "
                              "was not determined")
