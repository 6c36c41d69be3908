"""Read a target tree as text: its region API, its regions, override kernels, fp32 precision.

Engine side and pure text (no import of the tree): the skill's step 0 greps the tree
before anything runs, and the answers decide how a harness may bind regions.

Region API generations (``torchtitan/distributed/local_compile.py``):
    config_regions       newer main: regions listed in the model config's
                         ``local_compile_regions``, bound by ``apply_local_compile(regions)``
    local_compile_config older trees: ``LocalCompileConfig(regions=[...])`` at recipe level
    none                 no local_compile API at all (torchtitan 0.3.0 is such a tree)

The embedded library (``examples/moe_layer``) declares its trainer settings in
``trainer_settings.py``; ``resolve_target_fp32_precision`` reads either kind of target.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

RegionApi = Literal["config_regions", "local_compile_config", "none"]

NO_API_MESSAGE = (
    "this tree has no local_compile API (torchtitan {version}); needs torchtitan main with "
    "torchtitan/distributed/local_compile.py"
)
REGION_API_NAME = "local_compile"
"""The decorator factory that declares a region: ``@local_compile("name")``."""
_FP32_PRECISION = re.compile(r"""fp32_precision\s*=\s*["'](\w+)["']""")
_ALLOW_TF32 = re.compile(r"""matmul\.allow_tf32\s*=\s*(True|False)""")
EMBEDDED_SETTINGS = Path("examples/moe_layer/trainer_settings.py")


class SourceHit(BaseModel):
    """One grep hit: where and what."""

    model_config = ConfigDict(frozen=True)

    path: str
    """Path relative to the tree root, e.g. "torchtitan/trainer.py"."""
    line: int
    value: str
    """The captured value: a region name, a precision, an override module name."""


class TreeInventory(BaseModel):
    """What step 0 learns from a torchtitan tree."""

    model_config = ConfigDict(frozen=True)

    package_dir: str
    """The torchtitan package folder that was read."""
    region_api: RegionApi
    region_api_message: str
    """Human-readable verdict; names the missing file when region_api is "none"."""
    regions: tuple[SourceHit, ...]
    """Every ``@local_compile("name")`` declaration."""
    override_kernels: tuple[SourceHit, ...]
    """Modules under ``torchtitan/overrides/`` or ``torchtitan_recipes/overrides/``."""
    fp32_precision: tuple[SourceHit, ...]
    """Every ``fp32_precision = "..."`` assignment (and legacy ``allow_tf32``)."""
    resolved_fp32_precision: str | None
    """The trainer's precision ("ieee" or "tf32"), or None when the hits disagree."""


def resolve_package_dir(tree: Path) -> Path:
    """Return the torchtitan package folder: ``tree/torchtitan`` in a checkout, or ``tree``.

    Raises:
        ValueError: ``tree`` is neither a torchtitan checkout nor the package itself.
    """
    tree = Path(tree)
    if (tree / "torchtitan" / "__init__.py").is_file():
        return tree / "torchtitan"
    if (tree / "__init__.py").is_file() and (tree / "distributed").is_dir():
        return tree
    raise ValueError(
        f"{tree} is not a torchtitan tree (no torchtitan/__init__.py and no "
        "distributed/ next to __init__.py); pass the checkout root"
    )


def _py_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _grep(root: Path, files: list[Path], pattern: re.Pattern[str]) -> list[SourceHit]:
    hits = []
    for path in files:
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
            for match in pattern.finditer(line):
                hits.append(SourceHit(path=str(path.relative_to(root)), line=number, value=match.group(1)))
    return hits


def declared_region_names(source: str) -> list[tuple[str, int]]:
    """(name, line) of every region declared in ``source``, read from its syntax.

    A declaration is a call of ``local_compile`` (plain name or attribute) whose first
    argument is a string literal: the decorator ``@local_compile("rope")`` or the same
    call applied by hand. Docstrings, comments and the API's own definition are not calls.
    A file that does not parse declares nothing.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        first = node.args[0]
        if name == REGION_API_NAME and isinstance(first, ast.Constant) and isinstance(first.value, str):
            found.append((first.value, node.lineno))
    return sorted(found, key=lambda hit: hit[1])


def list_region_declarations(root: Path, files: list[Path]) -> list[SourceHit]:
    """Every region declaration in ``files``, with its path relative to ``root``."""
    return [SourceHit(path=str(path.relative_to(root)), line=line, value=name)
            for path in files for name, line in declared_region_names(path.read_text(errors="replace"))]


def detect_region_api(package: Path) -> tuple[RegionApi, str]:
    """Return the region API generation of ``package`` and a one-line verdict."""
    module = package / "distributed" / "local_compile.py"
    text = "\n".join(p.read_text(errors="replace") for p in _py_files(package))
    if "local_compile_regions" in text:
        return "config_regions", "regions are listed in the model config's local_compile_regions"
    if "LocalCompileConfig" in text:
        return "local_compile_config", "regions are set at recipe level with LocalCompileConfig(regions=...)"
    if module.is_file():
        return "none", f"{module.name} exists but neither local_compile_regions nor LocalCompileConfig is used"
    return "none", NO_API_MESSAGE.format(version=probe_tree_version(package))


def probe_tree_version(package: Path) -> str:
    """The tree's version from ``assets/version.txt`` (checkout) or the dist-info (installed)."""
    version_txt = package.parent / "assets" / "version.txt"
    if version_txt.is_file():
        return version_txt.read_text().strip()
    for metadata in sorted(package.parent.glob("torchtitan-*.dist-info/METADATA")):
        for line in metadata.read_text(errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return "version unknown"


def list_override_kernels(tree: Path, package: Path) -> list[SourceHit]:
    """Modules under the overrides folders (``fused_mla``, ``fused_swiglu``, ...)."""
    folders = [package / "overrides", Path(tree) / "torchtitan_recipes" / "overrides"]
    root = package.parent
    return [
        SourceHit(path=str(p.relative_to(root)), line=1, value=p.stem)
        for folder in folders if folder.is_dir()
        for p in sorted(folder.glob("*.py")) if p.stem != "__init__"
    ]


def resolve_fp32_precision(hits: list[SourceHit]) -> str | None:
    """One precision from the grep hits: unset means torch's default ("ieee")."""
    values = {h.value for h in hits if h.value in ("ieee", "tf32")}
    values |= {"tf32" if h.value == "True" else "ieee" for h in hits if h.value in ("True", "False")}
    if not values:
        return "ieee"
    return values.pop() if len(values) == 1 else None


def probe_tree(tree: Path) -> TreeInventory:
    """Return the step-0 inventory of a torchtitan tree (see the module docstring)."""
    package = resolve_package_dir(tree)
    root = package.parent
    files = _py_files(package)
    api, message = detect_region_api(package)
    precision_hits = _grep(root, files, _FP32_PRECISION) + _grep(root, files, _ALLOW_TF32)
    return TreeInventory(
        package_dir=str(package),
        region_api=api,
        region_api_message=message,
        regions=tuple(list_region_declarations(root, files)),
        override_kernels=tuple(list_override_kernels(tree, package)),
        fp32_precision=tuple(precision_hits),
        resolved_fp32_precision=resolve_fp32_precision(precision_hits),
    )


def read_embedded_settings(tree: Path) -> dict[str, object]:
    """Return the literal constants of the embedded library's ``trainer_settings.py``."""
    module = ast.parse((Path(tree) / EMBEDDED_SETTINGS).read_text())
    settings: dict[str, object] = {}
    for node in module.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        )
        if isinstance(target, ast.Name) and node.value is not None:
            settings[target.id] = ast.literal_eval(node.value)
    return settings


def resolve_target_fp32_precision(tree: Path) -> tuple[str | None, str]:
    """Return the target trainer's fp32 precision and where it came from.

    The embedded library declares it (``FP32_PRECISION``); a torchtitan tree is grepped.
    Returns ``(None, reason)`` when a torchtitan tree sets conflicting values.
    """
    if (Path(tree) / EMBEDDED_SETTINGS).is_file():
        value = read_embedded_settings(tree).get("FP32_PRECISION")
        return (str(value) if value is not None else None), f"{EMBEDDED_SETTINGS}: FP32_PRECISION"
    inventory = probe_tree(tree)
    where = ", ".join(f"{h.path}:{h.line}={h.value}" for h in inventory.fp32_precision) or "not set (torch default)"
    return inventory.resolved_fp32_precision, f"grep fp32_precision/allow_tf32: {where}"
