"""Torch-side work of local-compile-perf: run only inside worker subprocesses."""
