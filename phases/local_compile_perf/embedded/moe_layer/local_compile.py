"""Named compile regions, with the contract of torchtitan's ``local_compile`` (newer main).

A glue function is declared a region with ``@local_compile("name")``. Nothing is compiled
at import: ``apply_local_compile(regions)`` binds the listed names process-wide to
``torch.compile(fn, fullgraph=True, **compile_kwargs)`` and sets every other region back
to eager. The decorated function reads its binding at call time, so a module that was
imported before the binding still sees it. ``fullgraph`` is forced: a region that breaks
its graph is a bug, not a fallback.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(kw_only=True, slots=True)
class _Region:
    name: str
    fn: Callable[..., Any]
    batch_invariant: bool
    compile_kwargs: dict[str, Any] = field(default_factory=dict)
    compiled: Callable[..., Any] | None = None


_REGIONS: dict[str, _Region] = {}


def local_compile(
    name: str, *, batch_invariant: bool = False, **compile_kwargs: Any
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Return a decorator that registers ``fn`` as the compile region ``name``.

    Args:
        name: region name, listed in ``apply_local_compile`` to enable it.
        batch_invariant: True when the compiled region gives bitwise the same rows
            whatever the batch around them (allowed in batch-invariant mode).
        **compile_kwargs: forwarded to ``torch.compile`` (e.g. ``options={...}`` for
            region-scoped Inductor options). ``fullgraph`` may only be True.

    Raises:
        ValueError: ``fullgraph`` other than True, or ``name`` already taken by
            another function.
    """
    if compile_kwargs.pop("fullgraph", True) is not True:
        raise ValueError(f"local_compile({name!r}): fullgraph is forced to True for regions")

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        _check_name_free(name, fn)
        region = _Region(
            name=name, fn=fn, batch_invariant=batch_invariant, compile_kwargs=compile_kwargs
        )
        _REGIONS[name] = region

        @functools.wraps(fn)
        def call_region(*args: Any, **kwargs: Any) -> Any:
            bound = region.compiled if region.compiled is not None else region.fn
            return bound(*args, **kwargs)

        call_region.region_name = name  # type: ignore[attr-defined]
        return call_region

    return decorate


def _check_name_free(name: str, fn: Callable[..., Any]) -> None:
    """A re-import of the same function may re-register; another function may not."""
    old = _REGIONS.get(name)
    if old is None:
        return
    same = (old.fn.__module__, old.fn.__qualname__) == (fn.__module__, fn.__qualname__)
    if not same:
        raise ValueError(
            f"local_compile: region {name!r} is already registered by "
            f"{old.fn.__module__}.{old.fn.__qualname__}; pick another name for "
            f"{fn.__module__}.{fn.__qualname__}"
        )


def registered_regions() -> tuple[str, ...]:
    """Names of every region registered so far, sorted."""
    return tuple(sorted(_REGIONS))


def enabled_regions() -> tuple[str, ...]:
    """Names of the regions currently bound to a compiled function, sorted."""
    return tuple(sorted(name for name, r in _REGIONS.items() if r.compiled is not None))


def apply_local_compile(regions: Sequence[str], *, batch_invariant_mode: bool = False) -> None:
    """Compile exactly ``regions`` (process-wide); every other region runs eager.

    Args:
        regions: region names to enable; ``[]`` binds everything back to eager.
        batch_invariant_mode: refuse regions not declared ``batch_invariant``.

    Raises:
        ValueError: an unknown name (the message lists the registered ones), or a
            non-batch-invariant region in batch-invariant mode. Nothing is rebound then.
    """
    import torch

    unknown = sorted(set(regions) - set(_REGIONS))
    if unknown:
        raise ValueError(
            f"apply_local_compile: unknown region(s) {unknown}; registered: "
            f"{list(registered_regions())} (import the module that declares them first)"
        )
    if batch_invariant_mode:
        variant = sorted(n for n in regions if not _REGIONS[n].batch_invariant)
        if variant:
            raise ValueError(
                f"apply_local_compile: regions {variant} are not batch_invariant; "
                "drop them or declare them batch_invariant=True after checking bitwise rows"
            )
    enabled = set(regions)
    for name, region in _REGIONS.items():
        region.compiled = (
            torch.compile(region.fn, fullgraph=True, **region.compile_kwargs)
            if name in enabled
            else None
        )
