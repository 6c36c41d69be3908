"""Worker: run the target's own numerics scripts (``numerical_equivalence.py`` for one model,
``numerical_equivalence_pretrained.py`` for one checkpoint), output kept verbatim.

The script runs unmodified as ``__main__`` (``runpy``) with the skill's arguments, in this
worker process of the target (so torchtitan is imported once). Its stdout and stderr go to
one buffer, in order, exactly as a terminal would show them. One read-only observation is
added: a global forward pre-hook records the shapes the target's Titan MoE received, so a
script that feeds its MoE a layout it no longer takes can be named as the cause.
"""

from __future__ import annotations

import contextlib
import io
import runpy
import sys
import traceback
from typing import Any

from pydantic import BaseModel, Field

MAX_RECORDED = 8


class ScriptRequest(BaseModel):
    """Which tree script to run, on what."""

    script: str
    """Path of the script relative to the target."""
    model_type: str = ""
    """``--models`` of numerical_equivalence.py."""
    weights: str = ""
    """``--model_dir`` of numerical_equivalence_pretrained.py (a checkpoint directory)."""
    device: str = "auto"
    """"auto" leaves the script's default."""
    seed: int


class ScriptAnswer(BaseModel):
    """What the script did, verbatim."""

    argv: list[str]
    returncode: int
    output: str
    """stdout and stderr, in order."""
    moe_inputs: list[dict[str, Any]] = Field(default_factory=list)
    """Shapes the target's Titan MoE received (at most ``MAX_RECORDED``)."""


def run_numerical_equivalence(request: Any) -> dict[str, Any]:
    """``ScriptRequest`` with ``model_type``, answer ``ScriptAnswer``."""
    req = ScriptRequest.model_validate(request)
    return run_script(req.script, ["--models", req.model_type], req)


def run_pretrained_script(request: Any) -> dict[str, Any]:
    """The tree's numerical_equivalence_pretrained.py: ``ScriptRequest`` with ``weights``."""
    req = ScriptRequest.model_validate(request)
    return run_script(req.script, ["--model_dir", req.weights], req)


def run_script(script: str, args: list[str], request: ScriptRequest) -> dict[str, Any]:
    argv = [script, *args, "--seed", str(request.seed)]
    if request.device != "auto":
        argv += ["--device", request.device]
    buffer, inputs = io.StringIO(), []
    handle = _record_titan_moe_inputs(inputs)
    saved_argv, code = sys.argv, 0
    try:
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            sys.argv = argv
            try:
                runpy.run_path(script, run_name="__main__")
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:  # noqa: BLE001 (an uncaught error is part of the script's output)
                traceback.print_exc(file=buffer)
                code = 1
    finally:
        sys.argv = saved_argv
        handle.remove()
    return {"argv": ["python", *argv], "returncode": code, "output": buffer.getvalue(), "moe_inputs": inputs}


def _record_titan_moe_inputs(inputs: list[dict[str, Any]]) -> Any:
    from torch.nn.modules.module import register_module_forward_pre_hook

    def record(module: Any, args: tuple) -> None:
        cls = type(module)
        if len(inputs) >= MAX_RECORDED or not cls.__module__.startswith("torchtitan.") \
                or not hasattr(module, "routed_experts"):
            return
        shapes = [list(a.shape) for a in args if hasattr(a, "shape")]
        inputs.append({"module": f"{cls.__module__}.{cls.__qualname__}", "input_shapes": shapes})

    return register_module_forward_pre_hook(record)
