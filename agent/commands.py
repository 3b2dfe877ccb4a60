"""The agent's `radixagent` commands (registered under the `radixagent.commands` entry-point group)."""

from __future__ import annotations

COMMANDS: dict[str, tuple[str, str]] = {
    "trace": ("agent.trace_cli", "per-step table of a trace.jsonl"),
}
