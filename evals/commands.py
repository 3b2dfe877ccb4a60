"""The `radixagent` console script: every subcommand, each implemented where its concept lives.

This module sits at the top of the import graph (evals may name every layer; runtime names none
above it), so the command table that spans runtime, agent, tasks and evals lives here.
`python -m evals.commands COMMAND ...` is the same as `radixagent COMMAND ...`.
"""

from __future__ import annotations

import sys

from runtime.cli import RUNTIME_COMMANDS, dispatch

COMMANDS: dict[str, tuple[str, str]] = {
    "serve": RUNTIME_COMMANDS["serve"],
    "demo": ("tasks.demo", "the main job: a long-document QA agent run with per-step cache hits"),
    "qa": ("tasks.qa_cli", "answer questions about a document (--doc FILE --questions FILE)"),
    "eval": ("evals.cli", "cached vs uncached agent suites, report and charts"),
    "eval-eviction": ("evals.eviction.cli", "compare eviction policies on replayed agent workloads"),
    "cluster": RUNTIME_COMMANDS["cluster"],
    "eval-cluster": ("evals.cluster", "routing policies compared on a local cluster"),
    "trace": ("agent.trace_cli", "per-step table of a trace.jsonl"),
    "eval-misses": ("evals.misses.cli", "injected cache-miss causes vs the trace's miss attribution"),
    "gen-needle": ("tasks.needle", "generate needle-in-a-haystack QA sets"),
    "launch-sglang": RUNTIME_COMMANDS["launch-sglang"],
}


def main(argv: list[str] | None = None) -> int:
    return dispatch(COMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())
