"""The eviction record behind `meta_info.evicted_prefix_tokens` (issue 19), on the real tree."""

from __future__ import annotations

import random

from runtime.cache.evictions import EvictionRecord
from runtime.cache.kv_pool import SlotAllocator
from runtime.cache.manager import RadixCacheManager
from runtime.cache.policies import make_policy
from runtime.cache.radix import RadixCache


def make(size: int = 64) -> RadixCache:
    return RadixCache(SlotAllocator(size), make_policy("lru"))


def put(cache: RadixCache, key: list[int], ns: str = "") -> None:
    """Run `key` as a request through the engine's cache owner: match, compute the rest, insert."""
    manager = RadixCacheManager(cache)
    lease = manager.start(key, len(key), ns)
    manager.release(lease, key, len(key), insert=True)


def reach(cache: RadixCache, key: list[int], ns: str = "") -> tuple[int, int]:
    """(matched, evicted) as the manager reports them for a request with prompt `key`."""
    manager = RadixCacheManager(cache)
    lease = manager.start(key, len(key), ns)
    found = lease.cached_len, lease.evicted_len
    manager.release(lease, key, 0, insert=False)
    return found


def test_no_eviction_reports_zero() -> None:
    c = make()
    put(c, [1, 2, 3, 4])
    assert reach(c, [1, 2, 3, 4, 5]) == (4, 0)


def test_whole_chain_evicted_is_followed() -> None:
    c = make()
    put(c, [1, 2, 3, 4])
    put(c, [1, 2, 3, 4, 5, 6, 7])  # a child of the first path
    c.evict(100)
    assert c.total_size == 0
    assert reach(c, [1, 2, 3, 4, 5, 6, 7, 8]) == (0, 7)
    assert reach(c, [1, 2, 3, 9]) == (0, 3)  # diverges inside the evicted span


def test_partial_eviction_and_namespaces() -> None:
    c = make()
    put(c, [1, 2, 3])
    put(c, [1, 2, 3, 4, 5], "tenant")
    put(c, [1, 2, 3, 9, 9, 9])
    c.evict(100)  # both namespaces lose everything
    assert reach(c, [1, 2, 3, 9, 9, 9, 0]) == (0, 6)
    assert reach(c, [1, 2, 3, 4, 5, 0], "tenant") == (0, 5)
    # a salt never sees another's evicted spans
    assert reach(c, [1, 2, 3, 4, 5, 0], "other") == (0, 0)


def test_split_after_eviction_keeps_the_boundary() -> None:
    c = make()
    put(c, [1, 2, 3, 4, 5, 6])
    put(c, [1, 2, 3, 4, 5, 6, 7, 8])
    leaf = c.match_prefix([1, 2, 3, 4, 5, 6, 7, 8]).node
    c._remove_leaf(leaf)  # evict only [7, 8]
    put(c, [1, 2, 9])  # splits the surviving [1..6] node after 2 tokens
    assert reach(c, [1, 2, 3, 4, 5, 6, 7, 8, 0]) == (6, 2)


def test_randomized_against_a_shadow() -> None:
    """Reach equals what a shadow that never evicts would match, minus what the tree still has."""
    rng = random.Random(7)
    c = make(48)
    shadow: list[list[int]] = []
    for _ in range(300):
        key = [rng.randrange(3) for _ in range(rng.randrange(2, 12))]
        if c.allocator.available < len(key):
            c.evict(len(key))
        put(c, key)
        shadow.append(key)
        probe = [rng.randrange(3) for _ in range(rng.randrange(2, 14))]
        matched, evicted = reach(c, probe)
        best = max((common(probe, s) for s in shadow), default=0)
        assert matched <= best
        assert matched + evicted <= best


def common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_bounded() -> None:
    record = EvictionRecord(max_tokens=10)
    c = make()
    c.evictions = record
    for first in range(5):
        put(c, [first + 10, 1, 2, 3, 4])
    c.evict(100)
    assert record.tokens <= 10
    assert reach(c, [14, 1, 2, 3, 4, 5]) == (0, 5)  # the latest survive
    assert reach(c, [10, 1, 2, 3, 4, 5]) == (0, 0)
