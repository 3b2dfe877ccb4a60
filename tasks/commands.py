"""The tasks' `radixagent` commands (registered under the `radixagent.commands` entry-point group)."""

from __future__ import annotations

COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("tasks.demo", "the main job: a long-document QA agent run with per-step cache hits"),
    "qa": ("tasks.qa_cli", "answer questions about a document (--doc FILE --questions FILE)"),
    "gen-needle": ("tasks.needle", "generate needle-in-a-haystack QA sets"),
}
