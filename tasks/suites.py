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
from dataclasses import dataclass
from typing import Any

from runtime.backends.base import Backend


@dataclass(frozen=True, slots=True)
class SuiteOptions:
    """`limit`: at most this many items (None: the suite's default set). `prefix_cache` is sent on
    every request (False: the engine neither reads nor writes the cache for it)."""

    limit: int | None = None
    seed: int = 0
    concurrency: int = 1
    prefix_cache: bool = True
    progress: bool = False

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1 or None, got {self.limit}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")


@dataclass(slots=True)
class ItemOutcome:
    """One item of a suite. `status`: the agent's RunResult status ("answered", "max_steps", ...),
    "ok" for a chat, or "error". `steps`: the item's StepRecords (chat: one record per turn)."""

    item_id: str
    answer: str | None
    correct: bool | None
    status: str
    steps: list[Any]


@dataclass(slots=True)
class SuiteOutcome:
    suite: str
    items: list[ItemOutcome]
    e2e_s: float  # wall time of the whole suite, warm-up/prefill included

    @property
    def accuracy(self) -> float | None:
        judged = [i.correct for i in self.items if i.correct is not None]
        return sum(judged) / len(judged) if judged else None


def _longdoc(backend: Backend, options: SuiteOptions) -> SuiteOutcome:
    from tasks.qa import run_longdoc_suite

    return run_longdoc_suite(backend, options)


def _reasoning(backend: Backend, options: SuiteOptions) -> SuiteOutcome:
    from tasks.reasoning import run_reasoning_suite

    return run_reasoning_suite(backend, options)


def _chat(backend: Backend, options: SuiteOptions) -> SuiteOutcome:
    from tasks.chat import run_chat_suite

    return run_chat_suite(backend, options)


SUITES: dict[str, Callable[[Backend, SuiteOptions], SuiteOutcome]] = {
    "longdoc": _longdoc,
    "reasoning": _reasoning,
    "chat": _chat,
}


def run_suite(name: str, backend: Backend, options: SuiteOptions | None = None) -> SuiteOutcome:
    """Run suite `name` on `backend`. Raises ValueError for an unknown name."""
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; known: {sorted(SUITES)}")
    return SUITES[name](backend, options or SuiteOptions())
