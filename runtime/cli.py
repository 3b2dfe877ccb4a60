"""`radixagent` console script: one subcommand per job, each implemented where its concept lives.

Subcommands are imported lazily so `radixagent --help` and `radixagent trace` stay instant
(no torch import) and a missing optional piece only breaks its own subcommand.
"""

from __future__ import annotations

import importlib
import logging
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("runtime.server.cli", "SGLang-compatible HTTP server over the embedded engine"),
    "demo": ("tasks.demo", "the main job: a long-document QA agent run with per-step cache hits"),
    "qa": ("tasks.qa", "answer questions about a document (--doc FILE --questions FILE)"),
    "eval": ("evals.cli", "cached vs uncached agent suites, report and charts"),
    "eval-eviction": ("evals.eviction.cli", "compare eviction policies on replayed agent workloads"),
    "cluster": ("runtime.cluster", "N local workers behind sglang-router"),
    "eval-cluster": ("evals.cluster", "routing policies compared on a local cluster"),
    "trace": ("agent.trace_cli", "per-step table of a trace.jsonl"),
    "eval-misses": ("evals.misses.cli", "injected cache-miss causes vs the trace's miss attribution"),
    "gen-needle": ("tasks.needle", "generate needle-in-a-haystack QA sets"),
    "launch-sglang": ("runtime.sglang_plugin", "start a real SGLang server with the session-aware policy"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: radixagent COMMAND [ARGS...]   (radixagent COMMAND --help for each)", "", "commands:"]
    lines += [f"  {name:<{width}}  {about}" for name, (_, about) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"radixagent: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from runtime.env import offline_hub

    offline_hub()  # before any library imports tqdm or transformers
    try:
        module = importlib.import_module(COMMANDS[name][0])
    except ModuleNotFoundError as exc:
        print(f"radixagent {name}: not available in this install ({exc})", file=sys.stderr)
        return 2
    try:
        return int(module.main(rest) or 0)
    except KeyboardInterrupt:
        print(f"radixagent {name}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
