"""Global rule of the add-moe-model skill: TP sharding only through ``_sharding_config``.

Finds, on the *added* lines of a unified diff (``git diff`` output), the calls the skill
forbids in integration code: forward hooks that convert to DTensor and
``parallelize_module``. Context and removed lines are ignored, so a pre-existing hook
(the numerics script's gate cast) never trips it. The guard reads each changed Python file's
AST (``check_files_for_forbidden_calls``): calls, attribute names, imports, aliases and
strings built from constants; a plain text scan of the added lines
(``check_added_lines_for_forbidden_calls``) is the fallback for files that do not parse.
No torch, no git.
"""

from __future__ import annotations

import re

FORBIDDEN_CALLS = ("register_forward_pre_hook", "register_forward_hook", "parallelize_module")
_PATTERN = re.compile(r"\b(" + "|".join(FORBIDDEN_CALLS) + r")\b")
_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@")


def check_added_lines_for_forbidden_calls(diff_text: str, *, scope: str | None = None) -> list[str]:
    """Return one finding per added line that names a forbidden call.

    Args:
        diff_text: unified diff, e.g. ``git diff <base>`` of the target.
        scope: only files whose path starts with this prefix (e.g. the EXP folder).

    Returns:
        ``"<path>:<line>: adds <call> (shard through _sharding_config instead): <code>"``
        for each offending line; empty when clean.
    """
    findings: list[str] = []
    for path, line_no, text in _added(diff_text):
        match = _PATTERN.search(text)
        if match and (scope is None or path.startswith(scope)):
            findings.append(f"{path}:{line_no}: adds {match.group(1)} "
                            f"(shard through _sharding_config instead): {text.strip()}")
    return findings


def _strip_prefix(path: str) -> str:
    path = path.split("\t", 1)[0]
    return path[2:] if path.startswith(("a/", "b/")) else path


# --- the AST reading used by the guard ------------------------------------------------------

AST_FORBIDDEN = FORBIDDEN_CALLS + ("register_module_forward_hook", "register_module_forward_pre_hook",
                                   "_forward_hooks", "_forward_pre_hooks")
"""Names whose use (call, attribute, import, alias, or a string that spells them) the guard refuses;
the private hook dicts and the global hooks are the same thing reached another way."""


def forbidden_uses(source: str) -> list[tuple[int, int, str, str]]:
    """(first line, last line, name, how) for each use of a forbidden name in Python ``source``.

    ``how`` is "attribute" (``m.register_forward_hook``, also as an alias ``h = m.register_...``),
    "name" (a bare name, e.g. after ``from ... import parallelize_module``), "import" (an import
    of the name, aliased or not) or "string" (a string that spells the name, however it is built
    from constants: ``getattr(m, "register_" + "forward_hook")``, f-strings, ``"".join``,
    ``%``/``format``, names bound to such strings). Docstrings are not code and are skipped.
    Raises SyntaxError for source that does not parse.
    """
    import ast

    tree = ast.parse(source)
    constants = _string_constants(tree)
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)
                  and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}
    uses: dict[tuple[int, str], tuple[int, int, str, str]] = {}
    for node in ast.walk(tree):
        for name, how in _names_used(node, constants, docstrings):
            end = getattr(node, "end_lineno", None) or node.lineno
            uses.setdefault((node.lineno, name), (node.lineno, end, name, how))
    return sorted(uses.values())


def _names_used(node: object, constants: dict[str, str], docstrings: set[int]) -> list[tuple[str, str]]:
    import ast

    if isinstance(node, ast.Attribute) and node.attr in AST_FORBIDDEN:
        return [(node.attr, "attribute")]
    if isinstance(node, ast.Name) and node.id in AST_FORBIDDEN:  # noqa: SIM114
        return [(node.id, "name")]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(n, "import") for alias in node.names for n in AST_FORBIDDEN if n in alias.name.split(".")]
    if isinstance(node, ast.expr) and id(node) not in docstrings:
        text = _fold(node, constants)
        if text is not None and not (isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load)):
            return [(n, "string") for n in AST_FORBIDDEN if n in text]
    return []


def _string_constants(tree: object) -> dict[str, str]:
    """Names assigned a string built from constants anywhere in the file (scopes merged: a guard,
    not a compiler), folded until nothing changes."""
    import ast

    assignments = [(t.id, node.value) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                   for t in node.targets if isinstance(t, ast.Name)]
    assignments += [(node.target.id, node.value) for node in ast.walk(tree)
                    if isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name)
                    and node.value is not None]
    constants: dict[str, str] = {}
    for _ in range(5):
        before = dict(constants)
        for name, value in assignments:
            text = _fold(value, constants)
            if text is not None:
                constants[name] = text
        if constants == before:
            break
    return constants


def _fold(node: object, constants: dict[str, str]) -> str | None:
    """The string an expression evaluates to when it is built from constants only, else None."""
    import ast

    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    if isinstance(node, ast.JoinedStr):
        parts = [_fold(v.value if isinstance(v, ast.FormattedValue) else v, constants) for v in node.values]
        return "".join(parts) if all(p is not None for p in parts) else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        left = _fold(node.left, constants)
        right = (_fold(node.right, constants) if not isinstance(node.right, ast.Tuple)
                 else _fold_all(node.right.elts, constants))
        if left is None or right is None:
            return None
        if isinstance(node.op, ast.Add):
            return left + right if isinstance(right, str) else None
        try:
            return left % (tuple(right) if isinstance(right, list) else right)
        except (TypeError, ValueError):
            return None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        base = _fold(node.func.value, constants)
        if base is None:
            return None
        if node.func.attr == "join" and len(node.args) == 1 and isinstance(node.args[0], (ast.List, ast.Tuple)):
            parts = _fold_all(node.args[0].elts, constants)
            return base.join(parts) if parts is not None else None
        if node.func.attr == "format":
            args = _fold_all(node.args, constants)
            try:
                return base.format(*args) if args is not None else None
            except (IndexError, KeyError, ValueError):
                return None
        if node.func.attr in ("lower", "upper", "strip", "replace") and not node.keywords:
            args = _fold_all(node.args, constants)
            return getattr(base, node.func.attr)(*args) if args is not None else None
    return None


def _fold_all(nodes: list, constants: dict[str, str]) -> list[str] | None:
    parts = [_fold(n, constants) for n in nodes]
    return parts if all(p is not None for p in parts) else None  # type: ignore[return-value]


def _added(diff_text: str):
    """Yield ``(path, line number in the new file, text)`` for each line a unified diff adds."""
    path, line_no = "", 0
    for raw in diff_text.splitlines():
        if raw.startswith("+++ "):
            path = _strip_prefix(raw[4:].strip())
        elif raw.startswith("--- ") or raw.startswith("diff --git"):
            continue
        elif hunk := _HUNK.match(raw):
            line_no = int(hunk.group(1))
        elif raw.startswith("+"):
            yield path, line_no, raw[1:]
            line_no += 1
        elif not raw.startswith("-") and not raw.startswith("\\"):
            line_no += 1


def added_lines(diff_text: str) -> dict[str, set[int]]:
    """Path -> numbers of the lines a unified diff adds (in the new file)."""
    added: dict[str, set[int]] = {}
    for path, line_no, _ in _added(diff_text):
        added.setdefault(path, set()).add(line_no)
    return added


def check_files_for_forbidden_calls(diff_text: str, root: str, *, scope: str) -> list[str]:
    """Findings for the added lines of ``diff_text`` under ``scope``, read from the files' AST.

    A Python file that does not parse falls back to the text scan of its added lines.
    """
    from pathlib import Path

    text_findings = check_added_lines_for_forbidden_calls(diff_text, scope=scope)
    findings: list[str] = []
    for path, lines in sorted(added_lines(diff_text).items()):
        file = Path(root) / path
        if not path.startswith(scope):
            continue
        try:
            if not path.endswith(".py"):
                raise ValueError("not Python")
            source = file.read_text(encoding="utf-8")
            uses = forbidden_uses(source)
        except (OSError, SyntaxError, ValueError):
            findings += [f for f in text_findings if f.startswith(f"{path}:")]
            continue
        code = source.splitlines()
        for first, last, name, how in uses:
            if lines & set(range(first, last + 1)):
                findings.append(f"{path}:{first}: adds {name} ({how}; shard through _sharding_config instead): "
                                f"{code[first - 1].strip()}")
    return findings
