"""The `radixagent` console script: one dispatcher over the commands every package contributes.

Each package declares a table `{name: (module with a main(argv) -> int, one-line description)}`
naming only its own modules, and registers it in pyproject.toml under the entry-point group
`radixagent.commands`; this module reads the group, so it names no package above the runtime (no
upward import arrow, not even in a string). `python -m runtime.cli COMMAND ...` is the same as
`radixagent COMMAND ...`.

Subcommands are imported lazily so `--help` stays instant (no torch import) and a missing optional
piece only breaks its own subcommand.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Mapping
from importlib.metadata import entry_points

GROUP = "radixagent.commands"

#: The runtime's own commands: name -> (module with a `main(argv) -> int`, one-line description)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("runtime.server.cli", "SGLang-compatible HTTP server over the embedded engine"),
    "cluster": ("runtime.cluster.cli", "N local workers behind sglang-router"),
    "launch-sglang": ("runtime.sglang_launch", "start a real SGLang server with the session-aware policy"),
}


def discover() -> dict[str, tuple[str, str]]:
    """The runtime's commands first, then each installed package's table (by entry-point name)."""
    found = dict(COMMANDS)
    for entry in sorted(entry_points(group=GROUP), key=lambda e: e.name):
        if entry.value.partition(":")[0] == __name__:
            continue
        try:
            table = entry.load()
        except ImportError as exc:  # a package missing from this install loses only its commands
            logging.getLogger(__name__).debug("commands of %s unavailable: %s", entry.name, exc)
            continue
        found.update({name: spec for name, spec in table.items() if name not in found})
    return found


def usage(commands: Mapping[str, tuple[str, str]], prog: str = "radixagent") -> str:
    width = max(map(len, commands))
    lines = [f"usage: {prog} COMMAND [ARGS...]   ({prog} COMMAND --help for each)", "", "commands:"]
    lines += [f"  {name:<{width}}  {about}" for name, (_, about) in commands.items()]
    return "\n".join(lines)


def dispatch(commands: Mapping[str, tuple[str, str]], argv: list[str] | None = None) -> int:
    """Run `argv[0]`'s module's `main(argv[1:])`; usage on no command, exit 2 on an unknown one."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage(commands))
        return 0
    name, rest = argv[0], argv[1:]
    if name not in commands:
        print(f"radixagent: unknown command {name!r}\n\n{usage(commands)}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from runtime.env import offline_hub

    offline_hub()  # before any library imports tqdm or transformers
    try:
        module = importlib.import_module(commands[name][0])
    except ModuleNotFoundError as exc:
        print(f"radixagent {name}: not available in this install ({exc})", file=sys.stderr)
        return 2
    try:
        return int(module.main(rest) or 0)
    except KeyboardInterrupt:
        print(f"radixagent {name}: interrupted", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    return dispatch(discover(), argv)


if __name__ == "__main__":
    sys.exit(main())
