"""The import graph of the project's packages, read statically (no module is imported): no cycle
between modules, and layers only import downwards: runtime < agent < tasks < evals.

An edge is any `import` / `from ... import` anywhere in a module (function bodies included; a name
imported from a package counts as its submodule when one exists), plus any string constant that is
exactly a project module's dotted name, optionally with `:attr` (importlib registries, entry points,
`python -m` commands). Docstrings do not count.
"""

from __future__ import annotations

import ast
import re
import tomllib
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("runtime", "agent", "tasks", "evals")  # each may import only the ones before it
MODULE_STRING = re.compile(r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)+(:[A-Za-z_]\w*)?$")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in LAYERS for p in sorted((ROOT / pkg).rglob("*.py"))}


def _resolve(name: str) -> str | None:
    """The project module `name` means: itself, else its longest prefix that is a module."""
    mods = modules()
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the docstring nodes of the module and of every class and function."""
    holders = [
        tree,
        *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)),
    ]
    return {
        id(h.body[0].value)
        for h in holders
        if h.body and isinstance(h.body[0], ast.Expr) and isinstance(h.body[0].value, ast.Constant)
    }


def _from_base(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join([*parts, *([node.module] if node.module else [])])


def _targets(module: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    skip = _docstrings(tree)
    imported: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(module, path, node)
            imported += [f"{base}.{a.name}" for a in node.names]
    resolved = {_resolve(n) for n in imported if n.split(".")[0] in LAYERS}
    strings = {  # a string counts only when it is exactly a module's name (with an optional :attr)
        n.value.partition(":")[0]
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip
    }
    found = {r for r in resolved if r is not None} | (strings & modules().keys())
    return found - {module}


@cache
def graph() -> dict[str, frozenset[str]]:
    return {m: frozenset(_targets(m, p)) for m, p in modules().items()}


def cycles(edges: dict[str, frozenset[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_the_scanner_sees_function_level_imports_and_module_strings():
    edges = graph()
    assert "runtime.server.cli" in edges["runtime.cli"]  # a string in a registry dict
    assert "runtime.backends.embedded" in edges["runtime.backends"]  # "module:Class" string
    assert "tasks.needle" in edges["tasks.commands"]
    assert cycles(
        {"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}), "d": frozenset()}
    ) == [["a", "b", "c"]]


def test_no_import_cycle_between_project_modules():
    found = cycles(graph())
    detail = [{m: sorted(graph()[m] & set(c)) for m in c} for c in found]
    assert not found, f"import cycles: {detail}"


def test_layers_import_only_downwards():
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    upward = sorted(
        f"{src} -> {dst}"
        for src, dsts in graph().items()
        for dst in dsts
        if rank[dst.split(".")[0]] > rank[src.split(".")[0]]
    )
    assert not upward, f"imports against the layer order {LAYERS}: {upward}"


def test_runtime_names_no_upper_layer_even_in_strings():
    """Stricter than the graph: no runtime string (outside docstrings) spells an upper layer's module."""
    pattern = re.compile(r"^(agent|tasks|evals)(\.\w+)*(:\w+)?$")
    bad = []
    for module, path in modules().items():
        if module.split(".")[0] != "runtime":
            continue
        tree = ast.parse(path.read_text())
        skip = _docstrings(tree)
        bad += [
            f"{module}:{n.lineno} {n.value!r}"
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant)
            and isinstance(n.value, str)
            and id(n) not in skip
            and pattern.match(n.value)
        ]
    assert not bad, bad


def test_each_package_contributes_its_own_commands_through_entry_points():
    """The `radixagent` dispatcher lives in the bottom layer and names no package above it: each
    package registers its own table under `radixagent.commands`, and each table names only modules of
    that package (so every command module sits where its concept lives)."""
    import importlib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["radixagent"] == "runtime.cli:main"
    tables = project["entry-points"]["radixagent.commands"]
    assert set(tables) == set(LAYERS)
    names: list[str] = []
    for layer, value in tables.items():
        module, _, attr = value.partition(":")
        assert module in modules() and module.split(".")[0] == layer, value
        table = getattr(importlib.import_module(module), attr)
        assert all(target.split(".")[0] == layer and target in modules() for target, _ in table.values())
        names += list(table)
    assert len(names) == len(set(names)), names  # no command is claimed twice
    for entry in project.get("entry-points", {}).values():
        for value in entry.values():
            assert value.partition(":")[0] in modules(), value
