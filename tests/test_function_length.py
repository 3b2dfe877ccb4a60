"""No function in the project's packages runs over 60 lines (read statically with ast, no module is
imported): a longer one is split into small functions, one concern each (a table, a section, a row).

A function's length is `end_lineno - lineno + 1` of its `def` (decorators not counted, its docstring
and nested functions counted); methods and nested functions are measured on their own too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("runtime", "agent", "tasks", "evals")
MAX_LINES = 60


def long_functions(root: Path = ROOT, limit: int = MAX_LINES) -> list[str]:
    """`path:line name (N lines)` of every function over `limit` lines in the packages."""
    found = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > limit:
                        where = path.relative_to(root).as_posix()
                        found.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_over_60_lines() -> None:
    too_long = long_functions()
    assert not too_long, f"functions over {MAX_LINES} lines (split them):\n" + "\n".join(too_long)


def test_the_check_names_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(60))
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals" / "m.py").write_text(
        f"def short():\n    return 1\n\n\nclass C:\n    async def long(self):\n{body}\n"
    )
    assert long_functions(tmp_path) == ["evals/m.py:6 long (61 lines)"]
