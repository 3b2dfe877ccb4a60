"""A typed, consistent read of the engine's state for stats, loads and integrity endpoints, so
that the server never reaches into the scheduler or the cache."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.cache.manager import CacheSnapshot


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    running: int
    waiting: int  # drained into the scheduler's queue (the submit inbox is not visible)
    queued: int  # waiting + still in the inbox
    waiting_tokens: int  # prompt tokens of the waiting requests
    waiting_uncached_tokens: int  # of those, what the tree would not serve now
    cache: CacheSnapshot
    locked_nodes: int
    lock_refs: int
    stats: dict[str, Any]  # `Engine.get_cache_stats()` from the same hold of the lock
    integrity_error: str | None = None  # set when taken with `check=True` and an invariant broke
