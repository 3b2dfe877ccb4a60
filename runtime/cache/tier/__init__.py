"""A second KV tier below the pool (issue #24): evicted prefixes are written to a store as
fixed-size pages and loaded back instead of recomputed.

- `keys`: page keys = a hash chain over (model fingerprint, namespace, token pages), so a key
  names one exact prefix of one tenant under one set of weights and KV format.
- `codec`: one page's K/V planes as bytes with a header and a checksum; anything that does not
  verify raises `CorruptEntry` and is never served.
- `store`: the `KVStore` interface and its errors; `file_store` (local, bounded, atomic writes)
  and `redis_store` (shared across workers).
- `tier`: `KVTier`, what the engine calls: `demote` on eviction, `extend` on a match.
"""

from __future__ import annotations

from runtime.cache.tier.store import CorruptEntry, KVStore, StoreUnavailable, TierError
from runtime.cache.tier.tier import KVTier, TierConfig, TierCounters

__all__ = [
    "CorruptEntry",
    "KVStore",
    "KVTier",
    "StoreUnavailable",
    "TierConfig",
    "TierCounters",
    "TierError",
]
