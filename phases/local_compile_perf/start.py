"""Before a run exists: the ``start`` options and the target, resolved into a git checkout.

``prepare`` resolves ``--target``:

    embedded   the embedded DeepSeek-V3 layer library as its own git workspace (a copy of
               the cached one under <state>/workspaces/, so runs never share stack branches)
    hf:TYPE    an empty git workspace; the HF decoder-layer harness (eager vs per-layer only),
               loaded by the ordinary factory ref ``HF_FACTORY:TYPE``
    PATH       a torchtitan git checkout, read as text by the tree adapter

Bad input exits 2 and writes nothing.
"""

from __future__ import annotations

import re
import secrets
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from orchestrator.errors import UsageError
from orchestrator.workflow import Prepared

EMBEDDED_HARNESS = "examples.moe_layer.harness:build_harness"
HF_FACTORY = "phases.local_compile_perf.work.hf_harness:build_hf_harness"
_BUDGET = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h)$")


class LcpOptions(BaseModel):
    """``orchestrator start local-compile-perf`` options (``--name value``)."""

    model_config = ConfigDict(extra="forbid")
    target: str
    """embedded | hf:<model_type> | PATH of a torchtitan checkout."""
    harness: str | None = None
    """module:factory of the harness (default: the embedded one; hf:TYPE for HF)."""
    tokens: tuple[int, ...] | None = None
    """Packed tokens per rank, at least 3 counts (skill: small to large); default by device."""
    per_layer_tokens: tuple[int, ...] = ()
    """Token counts where the per-layer compile tree is measured (default by device; needs --tokens)."""
    budget: str = "2h"
    device: str = "auto"
    runs: int = Field(default=3, ge=3)
    """Fresh processes per cited number (the skill's rule: at least 3)."""
    warmup: int | None = Field(default=None, ge=1)
    iters: int | None = Field(default=None, ge=1)
    profile_steps: int | None = Field(default=None, ge=1)
    """Warm-up, timed and profiled steps per measurement; default by device (see ``default_sizes``)."""
    correctness_tokens: int | None = None
    """Tokens of the parity captures (default: the smallest token count)."""
    delta_tokens: tuple[int, ...] = ()
    """Token counts of the findings' per-rewrite deltas (one fresh process per commit of an entry that holds
    several); each a per-layer count; default every per-layer count. Fewer counts, less device time."""
    sizes_why: str | None = None
    """Why the sizes given as options were chosen (plan.md and the devlog's plan entry say it; default "as given"),
    e.g. fewer steps than the skill's to fit a device session, with the spread they still keep."""
    rewrite_deltas: bool = True
    """Measure each rewrite's own delta where a stack entry holds several commits (``no``: left out, FINDINGS says
    so; for a device session too short for them)."""
    per_layer_stack: bool = True
    """Time per-layer compile of the stack's own code beside the findings' headline trees (the rewrites' share of
    the gain apart from the regions'; 3 fresh processes a per-layer count; ``no``: left out, FINDINGS says so)."""
    python: str | None = None

    @field_validator("tokens", "per_layer_tokens", "delta_tokens", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(int(v) for v in value.split(",") if v.strip())
        if isinstance(value, int):
            return (value,)
        return value

    @field_validator("tokens")
    @classmethod
    def _three_counts(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is None:
            return None
        if len(set(value)) < 3 or min(value) <= 0:
            raise ValueError(f"needs at least 3 distinct positive token counts (skill step 1), got {list(value)}")
        return tuple(sorted(set(value)))

    @field_validator("budget")
    @classmethod
    def _budget(cls, value: str) -> str:
        if not _BUDGET.match(value):
            raise ValueError(f"budget {value!r} must look like 90m, 2h or 3600s")
        return value


def resolve_budget_s(budget: str) -> float:
    number, unit = _BUDGET.match(budget).groups()  # type: ignore[union-attr]
    return float(number) * {"s": 1, "m": 60, "h": 3600}[unit]


def hf_harness_ref(spec: str) -> str:
    """The factory ref of ``hf:<model_type>[,attn=IMPL][,experts=IMPL]``."""
    return f"{HF_FACTORY}:{spec.removeprefix('hf:')}"


def prepare(options: LcpOptions, state_dir: str, *, runner: Any = None) -> Prepared:
    """Resolve the target into a git checkout and the harness; UsageError (exit 2) on bad input."""
    if options.per_layer_tokens and options.tokens is None:
        raise UsageError("--per-layer-tokens needs --tokens (the default token counts depend on the device)")
    bad_per_layer = sorted(set(options.per_layer_tokens) - set(options.tokens or ()))
    if bad_per_layer:  # refused before the workspace (or its cache) is made
        raise UsageError(f"--per-layer-tokens {bad_per_layer} are not among --tokens {list(options.tokens)}")
    bad_delta = sorted(set(options.delta_tokens) - set(options.per_layer_tokens))
    if bad_delta:
        raise UsageError(f"--delta-tokens {bad_delta} are not among --per-layer-tokens "
                         f"{list(options.per_layer_tokens)} (a delta sets per-layer-sized code side by side)")
    target, kind = resolve_target(options.target, state_dir=Path(state_dir))
    harness = options.harness or {"embedded": EMBEDDED_HARNESS, "hf": hf_harness_ref(options.target)}.get(kind)
    if harness and harness.startswith("hf:"):
        harness = hf_harness_ref(harness)
    recorded = options.model_dump(mode="json") | {"target_kind": kind, "target_spec": options.target,
                                                  "harness": harness}
    return Prepared(target=str(target), options=recorded)


def resolve_target(spec: str, *, state_dir: Path) -> tuple[Path, str]:
    """(checkout, kind) for ``--target``; kind is embedded, hf or tree."""
    if spec == "embedded":
        from phases.local_compile_perf.workspace import WorkspaceError, materialize_embedded_workspace

        try:
            cached = materialize_embedded_workspace(state_dir)
        except WorkspaceError as exc:
            raise UsageError(str(exc)) from None
        return copy_workspace(cached, name="lcp-embedded"), "embedded"
    if spec.startswith("hf:"):
        if not re.fullmatch(r"hf:[a-z0-9_]+(,(attn|experts)=[a-z0-9_]+)*", spec):
            raise UsageError(f"--target {spec!r}: expected hf:<model_type>[,attn=IMPL][,experts=IMPL], "
                             "e.g. hf:qwen3_moe or hf:qwen3_moe,attn=eager")
        return empty_workspace(state_dir, name=f"lcp-{spec[3:].split(',')[0]}"), "hf"
    path = Path(spec).expanduser().resolve()
    if not (path / ".git").exists():
        raise UsageError(f"--target {path} is not a git checkout; "
                         "pass embedded, hf:<model_type> or a torchtitan checkout")
    from phases.local_compile_perf.tree_adapter import resolve_package_dir

    try:
        resolve_package_dir(path)
    except ValueError as exc:
        raise UsageError(f"--target: {exc}") from None
    return path, "tree"


def _unique(state_dir: Path, name: str) -> Path:
    stamp = f"{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"
    return state_dir / "workspaces" / f"{name}-{stamp}"


def copy_workspace(cached: Path, *, name: str) -> Path:
    """A private copy of the cached workspace (with its git history and candidate branches)."""
    dest = _unique(cached.parent.parent, name)
    shutil.copytree(cached, dest, symlinks=True)
    return dest


def empty_workspace(state_dir: Path, *, name: str) -> Path:
    import git

    from orchestrator.workspaces import commit_as_bot

    dest = _unique(state_dir, name)
    dest.mkdir(parents=True)
    (dest / "README").write_text("workspace of an HF-harness local-compile-perf run (no code to change)\n")
    repo = git.Repo.init(dest, initial_branch="main")
    repo.index.add(["README"])
    commit_as_bot(repo, "empty workspace")
    return dest
