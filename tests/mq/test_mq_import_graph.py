"""The modules of gateway.mq.embedded import each other without a circle.

Why: qmgr.py and cluster.py used to import each other (one lazily), so neither could be
read, loaded or tested alone. Every import counts — at module level, inside functions,
relative, and by string (``importlib.import_module``) — except those under
``if TYPE_CHECKING:``, which never run: a connection and the handles it creates name each
other's types, and that is all such an import may do. Those type-only back-references
are listed exactly below, so a new one is a decision, not an accident.
"""

from __future__ import annotations

import ast
from pathlib import Path

import gateway.mq.embedded

PACKAGE = "gateway.mq.embedded"
ROOT = Path(gateway.mq.embedded.__file__).resolve().parent

#: (importer, imported) pairs allowed only under ``if TYPE_CHECKING:``.
TYPE_ONLY_IMPORTS = {
    ("cluster", "connection"), ("cluster", "qmgr"),
    ("connection", "qmgr"),
    ("definitions", "qmgr"),
    ("handle", "connection"),
    ("reports", "qmgr"),
    ("repository_queue", "connection"), ("repository_queue", "qmgr"),
}


def _modules() -> dict[str, Path]:
    return {p.stem: p for p in ROOT.glob("*.py") if p.stem != "__init__"}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _target(name: str, known: set[str]) -> str | None:
    """The sibling module ``name`` refers to (``gateway.mq.embedded.x[.y]`` -> x)."""
    if not name.startswith(PACKAGE + "."):
        return None
    first = name[len(PACKAGE) + 1:].split(".")[0]
    return first if first in known else None


def _imports(path: Path, known: set[str]) -> tuple[set[str], set[str]]:
    """(imports that run, imports under TYPE_CHECKING) of one module, as sibling names."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    runs: set[str] = set()
    type_only: set[str] = set()

    def visit(node: ast.AST, typing_only: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, typing_only)
            return
        found: list[str] = []
        if isinstance(node, ast.Import):
            found = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this package
                parts = PACKAGE.split(".")[: len(PACKAGE.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found = [base] + [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            arg = node.args[0]
            if name in ("import_module", "__import__") and isinstance(arg, ast.Constant) \
                    and isinstance(arg.value, str):
                found = [arg.value]
        for name in found:
            target = _target(name, known)
            if target is not None and target != path.stem:
                (type_only if typing_only else runs).add(target)
        for child in ast.iter_child_nodes(node):
            visit(child, typing_only)

    visit(tree, False)
    return runs, type_only - runs


def _graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    mods = _modules()
    runs: dict[str, set[str]] = {}
    type_only: dict[str, set[str]] = {}
    for name, path in mods.items():
        runs[name], type_only[name] = _imports(path, set(mods))
    return runs, type_only


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append([*stack[stack.index(nxt):], nxt])
            elif nxt not in state:
                walk(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            walk(node)
    return found


def test_no_import_circle_among_embedded_modules() -> None:
    runs, _ = _graph()
    assert "qmgr" in runs and "cluster" in runs  # the walk sees the package
    assert _cycles(runs) == []


def test_type_only_back_references_are_exactly_the_listed_ones() -> None:
    _, type_only = _graph()
    pairs = {(a, b) for a, targets in type_only.items() for b in targets}
    assert pairs == TYPE_ONLY_IMPORTS


def test_the_walk_finds_circles_through_lazy_relative_and_string_imports(
    tmp_path: Path,
) -> None:
    a = tmp_path / "a.py"
    a.write_text("def f():\n    from .b import x\n")
    b = tmp_path / "b.py"
    b.write_text("import importlib\nM = importlib.import_module('gateway.mq.embedded.a')\n")
    c = tmp_path / "c.py"
    c.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                 "    from gateway.mq.embedded import a\n")
    known = {"a", "b", "c"}
    graph = {p.stem: _imports(p, known)[0] for p in (a, b, c)}
    assert graph == {"a": {"b"}, "b": {"a"}, "c": set()}
    assert _imports(c, known)[1] == {"a"}
    assert _cycles(graph) == [["a", "b", "a"]]
