"""What this library's trainer sets, declared once (no torch import: the engine reads it).

A harness must time the layers under the same settings as training: the fp32 matmul
precision (``torch.backends.cuda.matmul.fp32_precision``), the activation checkpointing
mode of the recipe, and the regions the recipe enables today ("upstream").
"""

FP32_PRECISION = "tf32"
"""The trainer sets ``torch.backends.cuda.matmul.fp32_precision = "tf32"`` (router GEMM)."""

AC_MODE = "none"
"""The recipe trains without activation checkpointing."""

UPSTREAM_REGIONS: tuple[str, ...] = ("router",)
"""Regions the recipe enables today ("upstream"); a stack entry adds the regions it names to this tuple."""
