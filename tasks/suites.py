"""The uniform interface the eval suite calls: `run_suite(name, backend, options) -> SuiteOutcome`.

Every model call of a suite goes through the `backend` passed in (the eval wraps it to record each
call and to force the prefix cache on or off), and all sampling is greedy (temperature 0), so a cached
and an uncached run of the same suite produce identical outputs.

Suites (registry `SUITES`, by name):
- "longdoc": the long-document QA runner over a small bundled needle subset (one 2k document + its
  questions by default; `limit` bounds the questions).
- "reasoning": arithmetic / logic problems with a calculator tool and a gold-checking verifier that
  makes the agent reflect and roll back.
- "chat": short single- and multi-turn chats, plain `backend.generate` calls (little shared prefix).
"""

from __future__ import annotations

from collections.abc import Callable

from runtime.backends.base import Backend
from tasks.chat import run_chat_suite
from tasks.outcomes import ItemOutcome, SuiteOptions, SuiteOutcome
from tasks.qa import run_longdoc_suite
from tasks.reasoning import run_reasoning_suite

__all__ = ["SUITES", "ItemOutcome", "SuiteOptions", "SuiteOutcome", "run_suite"]


SUITES: dict[str, Callable[[Backend, SuiteOptions], SuiteOutcome]] = {
    "longdoc": run_longdoc_suite,
    "reasoning": run_reasoning_suite,
    "chat": run_chat_suite,
}


def run_suite(name: str, backend: Backend, options: SuiteOptions | None = None) -> SuiteOutcome:
    """Run suite `name` on `backend`. Raises ValueError for an unknown name."""
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; known: {sorted(SUITES)}")
    return SUITES[name](backend, options or SuiteOptions())
