"""A DeepSeek-V3-shaped decoder layer library (dense + MoE blocks) with named compile regions.

It is the embedded default target of the local-compile-perf workflow: small enough to
copy into a git workspace, real enough (MLA, complex RoPE, sigmoid group-limited router,
grouped-GEMM SwiGLU experts) to show the glue patterns the skill rewrites. It imports no
torchtitan. Regions: ``rms_norm``, ``rope``, ``router``, ``swiglu`` (see
``local_compile.py``); the trainer's settings are in ``trainer_settings.py``.
"""
