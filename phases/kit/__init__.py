"""The shared measurement kit of local-compile-perf: one module per measurement.

timing (CUDA events / host timer), cudagraph (whole-step replay), profile (kernel tables by
family), graphs (graph budget), bandwidth (copy probe), ideal (bytes -> ideal time, gap
table), rank (score and stop rule), screen (interleaved, rotated), confirm (fresh-process
median), correctness (vs eager and fp64), provenance, and measure_once (the script a
confirmation runs). Results are the frozen models of records.py. No module imports torch
at import time, so the engine may import any of them.
"""
