"""Edit the ``_MODEL_CONFIGS`` dict of numerical_equivalence.py with ``ast`` (engine side).

The skill allows Phase 2 to touch one thing in that script: its ``_MODEL_CONFIGS`` entry.
So the edit is positional, from the AST's own source spans (the rest of the file stays
byte-identical), and ``check_only_model_configs_changed`` proves it by comparing the two
module ASTs with the dict's value blanked, and the dict's other entries one by one.
"""

from __future__ import annotations

import ast
import json
from typing import Any

TABLE = "_MODEL_CONFIGS"


class ConfigEntryError(ValueError):
    """The script has no editable ``_MODEL_CONFIGS`` dict literal; the message says where."""

    code = "model_configs_not_found"


def render_entry(model_type: str, entry: dict[str, Any], *, indent: str = "    ") -> str:
    """Render ``"<model_type>": dict(k=v, ...),`` as Python source (one kwarg a line)."""
    body = "".join(f"{indent * 2}{key}={_literal(value)},\n" for key, value in entry.items())
    return f'{indent}"{model_type}": dict(\n{body}{indent}),\n'


def upsert_model_config(source: str, *, model_type: str, entry: dict[str, Any]) -> str:
    """Return ``source`` with the ``model_type`` entry of ``_MODEL_CONFIGS`` added or replaced."""
    table = find_model_configs(source)
    lines = source.splitlines(keepends=True)
    rendered = render_entry(model_type, entry)
    for key, value in zip(table.keys, table.values):
        if isinstance(key, ast.Constant) and key.value == model_type:
            start = _offset(lines, key.lineno, key.col_offset)
            end = _offset(lines, value.end_lineno, value.end_col_offset)
            if source[end:].lstrip(" ").startswith(","):
                end = source.index(",", end) + 1
            return source[:start] + rendered.strip() + source[end:]
    return _append_entry(source, lines, table, rendered)


def _literal(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    return repr(value)


def _assigned(node: ast.stmt) -> list[ast.expr]:
    """The targets a module-level statement assigns (none for anything but an assignment)."""
    if isinstance(node, ast.Assign):
        return node.targets
    return [node.target] if isinstance(node, ast.AnnAssign) else []


def find_model_configs(source: str) -> ast.Dict:
    """Return the dict literal assigned to ``_MODEL_CONFIGS`` at module level."""
    for node in ast.parse(source).body:
        targets = _assigned(node)
        if any(isinstance(t, ast.Name) and t.id == TABLE for t in targets) and isinstance(node.value, ast.Dict):
            return node.value
    raise ConfigEntryError(f"no module-level `{TABLE} = {{...}}` dict literal; add the entry by hand there")


def check_only_model_configs_changed(before_src: str, after_src: str, *, model_type: str | None = None) -> list[str]:
    """Problems if anything but ``_MODEL_CONFIGS`` (or, given ``model_type``, its other entries) changed."""
    try:
        before, after = ast.parse(before_src), ast.parse(after_src)
    except SyntaxError as exc:
        return [f"script does not parse: {exc}"]
    problems = []
    if _dump_without_table(before) != _dump_without_table(after):
        problems.append(f"code outside {TABLE} changed")
    if model_type is not None:
        old, new = _entries(before_src), _entries(after_src)
        changed = sorted(k for k in set(old) | set(new) if k != model_type and old.get(k) != new.get(k))
        if changed:
            problems.append(f"{TABLE} entries other than {model_type!r} changed: {changed}")
    return problems


def _append_entry(source: str, lines: list[str], table: ast.Dict, rendered: str) -> str:
    close = _offset(lines, table.end_lineno, table.end_col_offset) - 1
    head = source[:close]
    if table.values:
        last = _offset(lines, table.values[-1].end_lineno, table.values[-1].end_col_offset)
        if "," not in source[last:close]:
            head = source[:last] + "," + source[last:close]
    line_start = head.rfind("\n") + 1
    if head[line_start:].strip():
        return head + "\n" + rendered + source[close:]
    return head[:line_start] + rendered + head[line_start:] + source[close:]


def _offset(lines: list[str], lineno: int, col: int) -> int:
    # NOTE: ast columns are UTF-8 byte offsets; convert to a str index within the line.
    line = lines[lineno - 1]
    return sum(len(s) for s in lines[: lineno - 1]) + len(line.encode()[:col].decode())


def _dump_without_table(tree: ast.Module) -> str:
    for node in tree.body:
        targets = _assigned(node)
        if any(isinstance(t, ast.Name) and t.id == TABLE for t in targets):
            node.value = ast.Dict(keys=[], values=[])
    return ast.dump(tree, include_attributes=False)


def _entries(source: str) -> dict[Any, str]:
    try:
        table = find_model_configs(source)
    except ConfigEntryError:
        return {}
    return {
        getattr(k, "value", ast.dump(k)): ast.dump(v, include_attributes=False)
        for k, v in zip(table.keys, table.values)
    }
