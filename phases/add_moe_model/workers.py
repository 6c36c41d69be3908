"""The add_moe_model workers, each declared once: function, request model, answer model.

Phases call them as ``ctx.call(NUMERICS, CompareRequest(...))`` and get the answer model back;
the worker process validates the same models on its side (``orchestrator.worker_main``). This
module imports no torch: the models live beside their workers, whose modules load torch only
inside their functions.
"""

from __future__ import annotations

from orchestrator.phase_api import Worker
from phases.add_moe_model.compat import ProbeRequest, ProbeResponse
from phases.add_moe_model.work.build_check import BuildCheckRequest, BuildCheckResult
from phases.add_moe_model.work.numerics import CompareAnswer, CompareRequest
from phases.add_moe_model.work.pretrained import PretrainedRequest, PretrainedResult
from phases.add_moe_model.work.stage_trace import TraceResult
from phases.add_moe_model.work.synthetic import SyntheticRequest, SyntheticResponse
from phases.add_moe_model.work.trainer_assets import AssetsRequest, AssetsResult
from phases.add_moe_model.work.tree_script import ScriptAnswer, ScriptRequest

SEED = 42
"""The seed of every comparison a phase asks for (no start option sets it)."""

PROBE = Worker("phases.add_moe_model.work.probe:probe", ProbeRequest, ProbeResponse)
SYNTHETIC = Worker("phases.add_moe_model.work.synthetic:build_synthetic", SyntheticRequest, SyntheticResponse)
NUMERICS = Worker("phases.add_moe_model.work.numerics:compare_dtypes", CompareRequest, CompareAnswer)
TRACE = Worker("phases.add_moe_model.work.stage_trace:trace_stages", CompareRequest, TraceResult)
PRETRAINED = Worker("phases.add_moe_model.work.pretrained:compare_pretrained", PretrainedRequest, PretrainedResult)
TREE_NUMERICS = Worker("phases.add_moe_model.work.tree_script:run_numerical_equivalence", ScriptRequest, ScriptAnswer)
TREE_PRETRAINED = Worker("phases.add_moe_model.work.tree_script:run_pretrained_script", ScriptRequest, ScriptAnswer)
BUILD_CHECK = Worker("phases.add_moe_model.work.build_check:build_check", BuildCheckRequest, BuildCheckResult)
ASSETS = Worker("phases.add_moe_model.work.trainer_assets:make_assets", AssetsRequest, AssetsResult)
