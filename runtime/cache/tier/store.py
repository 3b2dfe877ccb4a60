"""The interface every tier backend implements, its errors, and a warn-once logger.

A store maps keys (hex strings from `keys.page_keys`) to opaque blobs (`codec.encode`). It
never raises for an unavailable or failing backend on the serving path: `get` answers None
(a miss), `put` answers False (not stored), and the failure is counted and logged once per
kind. The engine then recomputes; correctness never depends on the store.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

from runtime.errors import RadixAgentError

log = logging.getLogger("radixagent.tier")


class TierError(RadixAgentError):
    """Base of the tier's errors."""


class CorruptEntry(TierError):
    """A stored page failed verification (truncated, checksum, wrong key or format)."""


class StoreUnavailable(TierError):
    """The backend cannot be reached or used (Redis down, directory unwritable)."""


@dataclass(slots=True)
class StoreCounters:
    puts: int = 0
    put_bytes: int = 0
    put_failures: int = 0
    gets: int = 0
    get_bytes: int = 0
    get_misses: int = 0
    get_failures: int = 0
    deletes: int = 0
    evictions: int = 0  # entries the store dropped to stay within its bound
    evicted_bytes: int = 0


@dataclass(slots=True)
class WarnOnce:
    """Logs each kind of failure once (a dead store must not flood the log per page)."""

    seen: set[str] = field(default_factory=set)

    def __call__(self, kind: str, message: str, *args: object) -> None:
        if kind not in self.seen:
            self.seen.add(kind)
            log.warning(message + " (logged once; requests recompute)", *args)


class KVStore(ABC):
    """What `KVTier` needs from a backend. The background writer (writer.py) calls `put` on its
    own thread while the engine's worker thread calls the others: implementations must allow
    that (FileStore locks its index; the redis client's connection pool is thread-safe)."""

    name: str = "?"

    def __init__(self) -> None:
        self.counters = StoreCounters()
        self.warn = WarnOnce()

    @abstractmethod
    def get(self, key: str) -> bytes | bytearray | None:
        """The blob, or None when absent or the backend fails."""

    @abstractmethod
    def put(self, key: str, blob: bytes) -> bool:
        """Store `blob` (whole or not at all); False when it could not be stored."""

    @abstractmethod
    def contains(self, keys: Sequence[str]) -> list[bool]:
        """Presence of each key (all False when the backend fails)."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Drop one entry (a corrupt one); failures are ignored."""

    def prefix_hits(self, keys: Sequence[str]) -> int:
        """How many leading keys are present: pages are only usable from the start of the chain."""
        n = 0
        for present in self.contains(keys):
            if not present:
                break
            n += 1
        return n

    def footprint(self) -> dict[str, int]:
        """{"entries", "bytes"} held, as well as the backend can tell (-1: unknown)."""
        return {"entries": -1, "bytes": -1}

    def close(self) -> None:  # noqa: B027 — most stores hold nothing to release
        """Release connections or handles."""
