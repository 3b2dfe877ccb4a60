"""What a suite run produces and is asked for: the types the suites (tasks/qa.py, reasoning.py,
chat.py), their registry (tasks/suites.py) and the eval share. A leaf module, so the registry can
import the suites and the suites these types without a cycle."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
