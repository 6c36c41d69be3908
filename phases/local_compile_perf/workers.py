"""The local_compile_perf workers, each declared once: function, request model, answer model.

Phases call them as ``ctx.call(CONFIRM, ConfirmRequest(...))``, or inside another checkout as
``ctx.call(*in_checkout(path, SCREEN, request))`` (``candidates.in_checkout``). This module
imports no torch; the kit's workers are declared in ``phases.kit.workers``.
"""

from __future__ import annotations

from orchestrator.phase_api import Worker
from phases.kit.records import Correctness, ScreenResult
from phases.local_compile_perf.records import ParallelBuildCheck
from phases.local_compile_perf.work.beside import BesideAnswer, BesideRequest
from phases.local_compile_perf.work.candidate_checks import (
    CaptureAnswer, CorrectnessRequest, SaveCaptureRequest, ScreenRequest,
)
from phases.local_compile_perf.work.glue import GlueRequest, GlueResponse
from phases.local_compile_perf.work.measure_trees import ConfirmRequest, ConfirmResponse
from phases.local_compile_perf.work.probe import TargetProbe, TargetProbeRequest
from phases.local_compile_perf.work.tp_ep_check import ParallelCheckRequest
from phases.local_compile_perf.work.traps import TrapRequest, TrapResponse

_WORK = "phases.local_compile_perf.work"
PROBE = Worker(f"{_WORK}.probe:probe_target_worker", TargetProbeRequest, TargetProbe)
TRAPS = Worker(f"{_WORK}.traps:run_trap_checks", TrapRequest, TrapResponse)
CONFIRM = Worker(f"{_WORK}.measure_trees:confirm_variants_worker", ConfirmRequest, ConfirmResponse)
GLUE = Worker(f"{_WORK}.glue:measure_glue_worker", GlueRequest, GlueResponse)
SCREEN = Worker(f"{_WORK}.candidate_checks:screen_worker", ScreenRequest, ScreenResult)
CAPTURE = Worker(f"{_WORK}.candidate_checks:capture_worker", SaveCaptureRequest, CaptureAnswer)
COMPARE = Worker(f"{_WORK}.candidate_checks:compare_worker", CorrectnessRequest, Correctness)
TP_EP = Worker(f"{_WORK}.tp_ep_check:tp_ep_worker", ParallelCheckRequest, ParallelBuildCheck)
BESIDE = Worker(f"{_WORK}.beside:beside_worker", BesideRequest, BesideAnswer)
