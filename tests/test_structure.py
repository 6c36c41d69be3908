"""The module graph of the shipped code has no import cycle, and no module is over 400 lines.

An ``ast`` pass over every ``.py`` under ``orchestrator/``, ``phases/`` and ``bench/`` (tests are not
shipped). Each import counts wherever it stands: at the top, inside a function, under ``TYPE_CHECKING``.
``import a.b``, ``from a import b`` (``b`` a submodule or a name of ``a``), relative imports, and
``importlib.import_module`` of a string literal (or of a loop variable that runs over a tuple of
literals) all become edges, to the module imported and to each package above it (importing ``a.b.c``
runs ``a`` and ``a.b`` first). What stands under ``if __name__ == "__main__":`` runs only when the file
is the program, as a module of another name (``__main__``), so it is no edge of the module itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ("orchestrator", "phases", "bench")
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def shipped_modules() -> dict[str, Path]:
    return {module_name(path): path for top in SHIPPED for path in sorted((ROOT / top).rglob("*.py"))}


def _absolute(module: str | None, level: int, here: str, is_package: bool) -> str:
    if not level:
        return module or ""
    base = here.split(".") if is_package else here.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _is_main_block(node: ast.stmt) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators))


def _module_nodes(tree: ast.Module) -> list[ast.AST]:
    """Every node of the module but those under ``if __name__ == "__main__":``."""
    return [node for statement in tree.body if not _is_main_block(statement) for node in ast.walk(statement)]


def _loop_literals(nodes: list[ast.AST]) -> dict[str, list[str]]:
    """``for name in ("a", "b", *rest)``: the string literals each loop variable runs over."""
    loops: dict[str, list[str]] = {}
    for node in nodes:
        if isinstance(node, ast.For) and isinstance(node.target, ast.Name) and isinstance(node.iter, ast.Tuple):
            loops.setdefault(node.target.id, []).extend(
                e.value for e in node.iter.elts if isinstance(e, ast.Constant) and isinstance(e.value, str))
    return loops


def _dynamic_import(node: ast.Call, loops: dict[str, list[str]]) -> list[str]:
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if called not in ("import_module", "__import__") or not node.args:
        return []
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return [arg.value]
    return loops.get(arg.id, []) if isinstance(arg, ast.Name) else []


def imported_modules(path: Path, here: str, modules: dict[str, Path]) -> set[str]:
    """The shipped modules one file imports, wherever the import stands."""
    nodes = _module_nodes(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    loops = _loop_literals(nodes)

    found: list[str] = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module, node.level, here, path.name == "__init__.py")
            found += [base, *(f"{base}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Call):
            found += _dynamic_import(node, loops)
    # a dotted name runs every package above it; ``from a import b`` names a.b, which is a module or a name of a
    return {prefix for name in found for prefix in _prefixes(name) if prefix in modules and prefix != here}


def _prefixes(dotted: str) -> list[str]:
    parts = dotted.split(".")
    return [".".join(parts[:end]) for end in range(1, len(parts) + 1)]


def import_graph() -> dict[str, set[str]]:
    modules = shipped_modules()
    return {name: imported_modules(path, name, modules) for name, path in modules.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: every component of more than one module, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif step not in index:
                index[step] = low[step] = len(index)
                stack.append(step)
                on_stack.add(step)
                work.append((step, iter(sorted(graph[step]))))
            elif step in on_stack:
                low[node] = min(low[node], index[step])
    return found


def test_the_checker_sees_a_cycle_through_an_import_inside_a_function(tmp_path: Path) -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "one.py").write_text("def f():\n    from . import two\n")
    (package / "two.py").write_text("import importlib\nfor m in ('pkg.one',):\n    importlib.import_module(m)\n"
                                    "if __name__ == '__main__':\n    import pkg\n")
    modules = {"pkg": package / "__init__.py", "pkg.one": package / "one.py", "pkg.two": package / "two.py"}
    assert imported_modules(package / "one.py", "pkg.one", modules) == {"pkg", "pkg.two"}
    assert imported_modules(package / "two.py", "pkg.two", modules) == {"pkg", "pkg.one"}


def test_no_import_cycle() -> None:
    # orchestrator.trail has none either (its store/verify/anchor cycle went with the trail issue): no allow-list
    assert strongly_connected(import_graph()) == []


def test_no_module_over_400_lines() -> None:
    lines = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in shipped_modules().items()}
    assert {name: n for name, n in lines.items() if n > MAX_LINES} == {}
