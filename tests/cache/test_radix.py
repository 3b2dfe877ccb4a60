from __future__ import annotations

import random

import pytest

from runtime.cache.kv_pool import SlotAllocator
from runtime.cache.manager import RadixCacheManager
from runtime.cache.policies import make_policy
from runtime.cache.radix import RadixCache


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def make(size: int = 64, policy: str = "lru") -> RadixCache:
    return RadixCache(SlotAllocator(size), make_policy(policy), clock=Clock())


def put(cache: RadixCache, key: list[int], ns: str = "") -> int:
    """One request through the engine's cache manager: match, lock, alloc, insert, free, unlock."""
    manager = RadixCacheManager(cache)
    lease = manager.start(key, len(key), ns)
    manager.release(lease, key, len(key), insert=True)
    return lease.cached_len


def test_exact_counts_and_split() -> None:
    c = make()
    assert put(c, [1, 2, 3, 4]) == 0
    assert c.match_prefix([1, 2, 3, 4, 5]).length == 4
    assert put(c, [1, 2, 9]) == 2  # split after two tokens
    assert c.match_prefix([1, 2]).length == 2
    assert c.match_prefix([7]).length == 0
    assert c.total_size == 5 and c.allocator.used == 5
    c.check_integrity()


def test_cached_length_peeks_without_changing_the_tree() -> None:
    c = make()
    put(c, [1, 2, 3, 4])
    before = [(n.key, n.last_access_time, n.hit_count) for n in c.nodes()]
    assert c.cached_length([1, 2, 3, 4, 5]) == 4
    assert c.cached_length([1, 2, 9]) == 2  # stops inside an edge: no split
    assert c.cached_length([1, 2, 3, 4], "other-tenant") == 0
    assert [(n.key, n.last_access_time, n.hit_count) for n in c.nodes()] == before
    c.check_integrity()


def test_namespaces_do_not_share() -> None:
    c = make()
    put(c, [1, 2, 3], "tenant-a")
    assert c.match_prefix([1, 2, 3], "tenant-b").length == 0
    assert put(c, [1, 2, 3], "tenant-b") == 0
    assert c.match_prefix([1, 2, 3], "tenant-a").length == 3
    c.check_integrity()


def test_eviction_never_frees_locked_nodes() -> None:
    c = make(8)
    put(c, [1, 2, 3, 4])
    put(c, [5, 6, 7, 8])
    m = c.match_prefix([1, 2, 3, 4])
    c.lock(m.node)
    assert c.evict(8) == 4
    assert c.match_prefix([1, 2, 3, 4]).length == 4
    assert c.match_prefix([5, 6]).length == 0
    c.unlock(m.node)
    c.check_integrity()


def test_path_nodes_splits_at_checkpoint() -> None:
    c = make()
    put(c, [1, 2, 3, 4, 5, 6])
    before = (c.counters.matches, c.counters.inserts)
    path = c.path_nodes([1, 2, 3, 4, 5, 6], split_at=3)
    assert [(n.key, start) for n, start in path] == [([1, 2, 3], 0), ([4, 5, 6], 3)]
    assert (c.counters.matches, c.counters.inserts) == before
    c.check_integrity()


@pytest.mark.parametrize("policy", ["lru", "lfu", "fifo", "slru", "priority", "session"])
def test_randomized_integrity(policy: str) -> None:
    rng = random.Random(policy)
    c = make(40, policy)
    locked = []
    for _ in range(300):
        key = [rng.randint(0, 3) for _ in range(rng.randint(1, 8))]
        m = c.match_prefix(key, rng.choice(["", "x"]))
        c.lock(m.node)
        need = len(key) - m.length
        if c.allocator.available < need:
            c.evict(need - c.allocator.available)
        if c.allocator.available >= need:
            new = c.allocator.alloc(need)
            held = c.insert(key, m.slots + new, m.node.namespace).present
            c.allocator.free(new[: held - m.length])
        locked.append(m.node)
        if len(locked) > 3 or rng.random() < 0.5:
            c.unlock(locked.pop(rng.randrange(len(locked))))
        c.check_integrity()
    for node in locked:
        c.unlock(node)
    c.evict(10**6)
    c.check_integrity()
    assert c.total_size == 0
