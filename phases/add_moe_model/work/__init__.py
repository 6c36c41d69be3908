"""Worker-side code of add_moe_model: runs in a subprocess that imports the target checkout.

Modules here import torch / transformers / torchtitan inside their functions, so the engine
can import the package (for names and pydantic models) without pulling torch in. Inside a
worker process (``python -m orchestrator.worker_main``), and only there, importing this
package first applies the torch compatibility layer (``torch_compat``), so torchtitan imports
on a torch older than it needs; the pieces applied are announced on the worker's log. A warm
worker server (``orchestrator.warm_worker``) is a worker too: it applies the same pieces before
its preloads, and each call forked from it announces them on its own log, as a fresh one does.
"""

import sys


WORKER_MAINS = ("orchestrator.worker_main", "orchestrator.warm_worker")


def _worker_main() -> str | None:
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec.name if spec is not None and spec.name in WORKER_MAINS else None


if _worker_main():
    from phases.add_moe_model.work.torch_compat import announce, apply_and_announce, applied_here

    apply_and_announce()
    if _worker_main() == "orchestrator.warm_worker":
        # the server runs as __main__: its hooks live there, not in a second import of the module
        sys.modules["__main__"].on_child(lambda: announce(applied_here()))
