"""mypy checks everything the `radixagent` command runs: each subcommand's module (from every
package's COMMANDS table) is in pyproject's [tool.mypy] files, itself or under a listed folder."""

from __future__ import annotations

import tomllib
from pathlib import Path

from runtime.cli import discover

ROOT = Path(__file__).resolve().parents[1]


def test_every_command_module_is_type_checked() -> None:
    files = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    commands = discover()  # what the dispatcher finds: every package's table
    assert {"serve", "demo", "qa", "eval", "eval-eviction", "trace"} <= set(commands)
    modules = {module for module, _help in commands.values()}

    def checked(module: str) -> bool:
        path = module.replace(".", "/")
        return any(path == f.removesuffix(".py") or path.startswith(f.rstrip("/") + "/") for f in files)

    assert sorted(m for m in modules if not checked(m)) == []
