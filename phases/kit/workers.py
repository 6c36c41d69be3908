"""The kit's own workers, each declared once: function, request model, answer model (torch-free)."""

from __future__ import annotations

from phases.kit.attention import GemmRateRequest
from phases.kit.bandwidth import BandwidthRequest
from phases.kit.graphs import GraphBudgetRequest
from phases.kit.measure_once import MeasureRequest, MeasureResult
from phases.kit.records import Bandwidth, GemmRate, GraphCount
from orchestrator.phase_api import Worker

BANDWIDTH = Worker("phases.kit.bandwidth:bandwidth_worker", BandwidthRequest, Bandwidth)
GEMM_RATE = Worker("phases.kit.attention:gemm_rate_worker", GemmRateRequest, GemmRate)
GRAPH_BUDGET = Worker("phases.kit.graphs:graph_budget_worker", GraphBudgetRequest, GraphCount)
MEASURE_TREE = Worker("phases.kit.measure_once:measure_tree_worker", MeasureRequest, MeasureResult)
