"""Worker-side code of add_moe_model: runs in a subprocess that imports the target checkout.

Modules here import torch / transformers / torchtitan inside their functions, so the engine
can import the package (for names and pydantic models) without pulling torch in. Inside a
worker process (``python -m orchestrator.worker_main``), and only there, importing this
package first applies the torch compatibility layer (``torch_compat``), so torchtitan imports
on a torch older than it needs; the pieces applied are announced on the worker's log.
"""

import sys


def _in_worker() -> bool:
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec is not None and spec.name == "orchestrator.worker_main"


if _in_worker():
    from phases.add_moe_model.work.torch_compat import apply_and_announce

    apply_and_announce()
