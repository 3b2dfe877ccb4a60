"""The evals' `radixagent` commands (registered under the `radixagent.commands` entry-point group)."""

from __future__ import annotations

COMMANDS: dict[str, tuple[str, str]] = {
    "eval": ("evals.suites.cli", "cached vs uncached agent suites, report and charts"),
    "eval-eviction": ("evals.eviction.cli", "compare eviction policies on replayed agent workloads"),
    "eval-cluster": ("evals.cluster.cli", "routing policies compared on a local cluster"),
    "eval-misses": ("evals.misses.cli", "injected cache-miss causes vs the trace's miss attribution"),
}
