"""Entry point of a worker subprocess: ``python -m orchestrator.worker_main FUNC IN OUT``.

Imports ``FUNC`` ("pkg.mod:fn") from the worker's sys.path (the target checkout first),
calls it with the JSON request read from IN, and writes the JSON answer to OUT. The
answer file appears only when the function returned (atomic rename), so a worker that
dies leaves no answer and the engine records it as FAILED. Standard library only.
"""

from __future__ import annotations

import importlib
import json
import os
import sys


def main(argv: list[str]) -> int:
    func_ref, request_path, answer_path = argv
    module_name, _, attr = func_ref.partition(":")
    func = getattr(importlib.import_module(module_name), attr)
    with open(request_path, encoding="utf-8") as handle:
        request = json.load(handle)
    answer = func(request)
    if hasattr(answer, "model_dump"):
        answer = answer.model_dump(mode="json")
    tmp = answer_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(answer, handle, allow_nan=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, answer_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
