"""The shared measurement kit: one module per measurement, and the harness contract.

harness (what a target provides: spec, seeded workload, region binding, per-layer compile;
the trees, dtypes and request models every worker shares), timing (CUDA events / host
timer), cudagraph (whole-step replay), profile (kernel tables by family), graphs (graph
budget), bandwidth (copy probe), ideal (bytes -> ideal time), rank (score and stop rule),
screen (interleaved, rotated), confirm (one fresh process), correctness (vs eager and fp64),
routing (replayed expert choices), provenance, registry (the real MoE models' published dims
both workflows build from), and measure_once (the script a confirmation runs). Results are the
frozen models of records.py. No module imports torch at import time, so the engine may import
any of them, and none imports a workflow.
"""
