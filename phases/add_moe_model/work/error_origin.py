"""Whose code raised an exception: the frame that decides who can fix it.

torch's own Python frames are passed over (they report a misuse by their caller), so
the innermost frame in transformers, the target's torchtitan, or this project decides.
A fix belongs to the agent only when that frame is the target's experiment folder. One
exception: an attribute missing on an object of a torchtitan class is that class's to
supply, wherever the read was (transformers reading a config the experiment folder built).
"""

from __future__ import annotations

import inspect
import re
import traceback
from typing import Literal

Origin = Literal["transformers", "target", "orchestrator", "torch", "other"]
_MARKERS: tuple[tuple[str, Origin], ...] = (
    ("/transformers/", "transformers"), ("/torchtitan/", "target"), ("/phases/", "orchestrator"),
    ("/orchestrator/", "orchestrator"),
)


def describe_error(exc: BaseException) -> str:
    """Error text plus the innermost frames, so triage can tell probe from load from kernel."""
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    where = " <- ".join(f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno} {f.name}" for f in reversed(frames))
    return f"{type(exc).__name__}: {exc} [at {where}]"


def error_origin(exc: BaseException) -> tuple[Origin, str]:
    """(origin, "path:line function") of the innermost frame outside torch; ("other", "") with no frames."""
    owner = _missing_attribute_owner(exc)
    if owner is not None:
        return owner
    frames = traceback.extract_tb(exc.__traceback__)
    seen_torch = None
    for frame in reversed(frames):
        path = frame.filename.replace("\\", "/")
        where = f"{_short(path)}:{frame.lineno} {frame.name}"
        if "/torch/" in path:
            seen_torch = seen_torch or where
            continue
        for marker, origin in _MARKERS:
            if marker in path:
                return origin, where
        return "other", where
    return ("torch", seen_torch) if seen_torch else ("other", "")


def _missing_attribute_owner(exc: BaseException) -> tuple[Origin, str] | None:
    """("target", "path:line Class (no 'name')") when ``exc`` is an attribute missing on an instance of a class
    torchtitan defines: the class lacks what its reader needs (JambaModel reads layers_block_type, a property of
    JambaConfig, from the experiment folder's Config)."""
    obj = getattr(exc, "obj", None) if isinstance(exc, AttributeError) else None
    if obj is None:
        return None
    cls = type(obj)
    try:
        path, line = inspect.getsourcefile(cls), inspect.getsourcelines(cls)[1]
    except (TypeError, OSError):
        return None
    path = (path or "").replace("\\", "/")
    if "/torchtitan/" not in path:
        return None
    return "target", f"{_short(path)}:{line} {cls.__qualname__} (has no {exc.name!r})"


def _short(path: str) -> str:
    for marker in ("/transformers/", "/torchtitan/", "/phases/", "/orchestrator/", "/torch/"):
        cut = path.rfind(marker)
        if cut >= 0:
            return path[cut + 1:]
    return path.rsplit("/", 1)[-1]


# Failures of the process the code runs in, whoever's frame raised them: never the agent's to fix.
PLUMBING = re.compile(r"Cannot re-initialize CUDA in forked subprocess")


def plumbing_failure(error: str) -> bool:
    """Whether ``error`` (an exception's text) is our process plumbing failing, not the code it ran."""
    return bool(PLUMBING.search(error))
