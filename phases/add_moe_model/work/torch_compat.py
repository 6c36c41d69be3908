"""Compatibility layer: the few torch symbols torchtitan 0.3.0 needs that an older torch lacks.

torchtitan 0.3.0 is written against torch nightlies; on torch 2.11 (the H200 machine's) its
import fails on ``DataParallelMeshDims`` and its one-GPU training path reaches three more
symbols. Each piece below is applied only when its symbol is missing, so a torch that has
it keeps its own behaviour untouched; the target checkout is never edited. ``apply()``
returns what it applied, and the caller records it (worker logs, trainer logs, the trail).

What cannot be provided is left alone on purpose: world sizes above 1 need
``fully_shard(dp_mesh_dims=...)`` to take spmd_types-annotated plain parameters, which no
shim can give (``fsdp_capability`` reports it; the parallelism phase makes it a root cause).

The pieces (torch release that brought the symbol):
- ``torch.distributed.fsdp.DataParallelMeshDims`` (2.12): a record of mesh dim names;
  torchtitan builds it and passes it to ``fully_shard`` only for world sizes above 1.
- ``torch.distributed.set_timeout`` (2.14): forwards to ``distributed_c10d._set_pg_timeout``.
- ``torch.compiler._is_non_strict_tracing`` (2.12): False, as no tracer of that torch sets it.
- ``create_block_mask(separate_full_blocks=...)`` (2.13): True is what older torch always
  does; False cannot be honoured there and raises.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import sys
from typing import Any, Callable

MARKER = "@@torch_compat "
"""Prefix of the one stderr line a process prints after applying pieces (parsed from logs)."""


def _has_data_parallel_mesh_dims() -> bool:
    import torch.distributed.fsdp as fsdp

    return hasattr(fsdp, "DataParallelMeshDims")


def _add_data_parallel_mesh_dims() -> None:
    import torch.distributed.fsdp as fsdp

    @dataclasses.dataclass(frozen=True)
    class DataParallelMeshDims:
        """Names of the mesh dims FSDP shards (``shard``) and replicates (``replicate``) on."""

        shard: str | tuple[str, ...] | None = None
        replicate: str | tuple[str, ...] | None = None

    DataParallelMeshDims.__module__ = "torch.distributed.fsdp"
    fsdp.DataParallelMeshDims = DataParallelMeshDims


def _has_set_timeout() -> bool:
    import torch.distributed as dist

    return hasattr(dist, "set_timeout")


def _add_set_timeout() -> None:
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    def set_timeout(timeout: Any, group: Any = None) -> None:
        distributed_c10d._set_pg_timeout(timeout, group)

    dist.set_timeout = set_timeout


def _has_non_strict_tracing() -> bool:
    import torch.compiler

    return hasattr(torch.compiler, "_is_non_strict_tracing")


def _add_non_strict_tracing() -> None:
    import torch.compiler

    torch.compiler._is_non_strict_tracing = lambda: False


def _has_separate_full_blocks() -> bool:
    from torch.nn.attention import flex_attention

    return "separate_full_blocks" in inspect.signature(flex_attention.create_block_mask).parameters


def _add_separate_full_blocks() -> None:
    from torch.nn.attention import flex_attention

    original = flex_attention.create_block_mask

    def create_block_mask(*args: Any, separate_full_blocks: bool = True, **kwargs: Any) -> Any:
        if not separate_full_blocks:
            raise NotImplementedError("create_block_mask(separate_full_blocks=False) needs torch >= 2.13; "
                                      "this torch always separates full blocks")
        return original(*args, **kwargs)

    create_block_mask.__wrapped__ = original
    flex_attention.create_block_mask = create_block_mask


PIECES: dict[str, tuple[Callable[[], bool], Callable[[], None]]] = {
    "torch.distributed.fsdp.DataParallelMeshDims": (_has_data_parallel_mesh_dims, _add_data_parallel_mesh_dims),
    "torch.distributed.set_timeout": (_has_set_timeout, _add_set_timeout),
    "torch.compiler._is_non_strict_tracing": (_has_non_strict_tracing, _add_non_strict_tracing),
    "create_block_mask(separate_full_blocks=)": (_has_separate_full_blocks, _add_separate_full_blocks),
}


_APPLIED: list[str] = []
"""Every piece applied in this process so far."""


def apply() -> list[str]:
    """Apply every missing piece (idempotent); returns the names applied by this call."""
    applied = []
    for name, (present, add) in PIECES.items():
        if not present():
            add()
            applied.append(name)
    _APPLIED.extend(applied)
    return applied


def applied_here() -> list[str]:
    """The pieces this process runs with (applied by any earlier ``apply``)."""
    return list(_APPLIED)


def report(applied: list[str]) -> dict[str, Any]:
    """What to record: the torch version and the pieces applied in this process."""
    import torch

    return {"torch": torch.__version__, "applied": applied}


def apply_and_announce() -> dict[str, Any]:
    """Apply, then print one ``@@torch_compat {json}`` line on stderr when anything was applied."""
    return announce(apply())


def announce(applied: list[str]) -> dict[str, Any]:
    """Print the ``@@torch_compat`` line for ``applied`` (nothing when empty); returns the record."""
    info = report(applied)
    if info["applied"]:
        print(MARKER + json.dumps(info, sort_keys=True), file=sys.stderr, flush=True)
    return info


def describe(_request: dict[str, Any]) -> dict[str, Any]:
    """Worker function: the pieces this process runs with, and any still missing (should be none)."""
    import torch

    return {"torch": torch.__version__, "applied": applied_here(),
            "missing": [name for name, (present, _) in PIECES.items() if not present()]}


def parse_announcements(log: str) -> list[dict[str, Any]]:
    """Every ``@@torch_compat`` record in a log (one per process that applied pieces)."""
    found = []
    for line in log.splitlines():
        if line.startswith(MARKER):
            try:
                found.append(json.loads(line[len(MARKER):]))
            except ValueError:
                continue
    return found


def fsdp_capability() -> dict[str, Any]:
    """Can this torch's FSDP take the plain, spmd-annotated parameters torchtitan shards at world > 1?

    Checked by doing it, not by the version string: ``fully_shard(dp_mesh_dims=...)`` on a
    plain parameter over a 2-rank fake mesh on meta. torch 2.11 has no such keyword
    (TypeError); 2.13 takes it but wants DTensors (ValueError).
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    accepts = "dp_mesh_dims" in inspect.signature(fully_shard).parameters
    result = {"torch": torch.__version__, "accepts_dp_mesh_dims": accepts, "ok": False, "error": None}
    if not accepts:
        result["error"] = "fully_shard() has no dp_mesh_dims parameter"
        return result
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import DataParallelMeshDims

    owns_group = not dist.is_initialized()
    if owns_group:
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp_shard",))
        with torch.device("meta"):
            module = torch.nn.Linear(8, 8, bias=False)
        fully_shard(module, mesh=mesh, dp_mesh_dims=DataParallelMeshDims(shard="dp_shard"))
        result["ok"] = True
    except Exception as exc:  # noqa: BLE001 - the exception is the finding
        result["error"] = f"{type(exc).__name__}: {exc}"[:500]
    finally:
        if owns_group:
            dist.destroy_process_group()
    return result
