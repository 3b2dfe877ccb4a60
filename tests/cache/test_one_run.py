"""A running request's positions are one run of pool slots where free space allows, so attention
reads them as a view (no per-layer gather): a matched prefix whose slots cannot be continued is
copied once into a fresh run; the copies are the lease's and go back at release."""

from __future__ import annotations

import torch

from runtime.cache.kv_format import KVFormat
from runtime.cache.kv_pool import KVPool
from runtime.cache.manager import RadixCacheManager
from runtime.cache.policies import make_policy
from runtime.cache.radix import RadixCache
from runtime.cache.request_kv import PooledKV

LAYERS, HEADS, DIM = 2, 2, 4


def _manager(size: int) -> tuple[RadixCacheManager, KVPool]:
    fmt = KVFormat.resolve("float32", torch.float32, torch.float32)
    pool = KVPool(size, LAYERS, HEADS, DIM, fmt, "cpu")
    return RadixCacheManager(RadixCache(pool, make_policy("lru")), PooledKV(pool)), pool


def _fill(pool: KVPool, slots: list[int], seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for plane in pool.planes:
        plane[:, :, slots] = torch.randn(LAYERS, HEADS, len(slots), DIM, generator=g)


def _is_run(slots: list[int]) -> bool:
    return slots == list(range(slots[0], slots[0] + len(slots)))


def test_a_blocked_prefix_is_copied_into_one_run_and_the_copies_go_back() -> None:
    manager, pool = _manager(64)
    a = manager.start(list(range(10)), 10)
    _fill(pool, a.slots, 0)
    manager.release(a, list(range(10)), 10, insert=True)  # the tree holds 0..9 at slots 0..9
    b = manager.start([*range(6), 99, 98], 8)  # shares 0..5; slots 6.. belong to the tree
    _fill(pool, b.slots[6:], 1)
    manager.release(b, [*range(6), 99, 98], 8, insert=True)
    tree_slots = manager.tree.find_node(list(range(6))).slots
    c = manager.start([*range(6), 50, 51, 52], 9, grow=4)
    assert c.cached_len == 6 and _is_run(c.slots) and len(c.slots) == 9
    assert not set(c.slots) & set(tree_slots)  # its own copy, not the tree's slots
    for plane in pool.planes:  # the copy holds the same bytes
        assert torch.equal(plane[:, :, c.slots[:6]], plane[:, :, tree_slots])
    assert c.spare == list(range(c.slots[-1] + 1, c.slots[-1] + 5))  # decode room held after the run
    manager.extend(c, 2)  # decode takes the held slots: still one run
    assert _is_run(c.slots) and len(c.spare) == 2
    manager.check_integrity()
    manager.check_integrity()
    free_before = pool.available
    manager.release(c, [*range(6), 50, 51, 52], 9, insert=True)
    manager.check_integrity()
    # the six copies, two decode slots past the inserted ids and the two spare ones come back
    assert pool.available == free_before + 6 + 2 + 2
    assert manager.tree.cached_length([*range(6), 50, 51, 52]) == 9


def test_a_continuable_prefix_is_not_copied() -> None:
    manager, pool = _manager(64)
    a = manager.start(list(range(8)), 8)
    manager.release(a, list(range(8)), 8, insert=True)
    b = manager.start([*range(8), 20, 21], 10, grow=2)  # slots 8.. are free: the prefix's run grows
    assert b.slots == list(range(10)) and not b.dups and b.spare == [10, 11]
    manager.release(b, [*range(8), 20, 21], 10, insert=False)
    manager.check_integrity()


def test_no_free_run_falls_back_to_scattered_slots_without_evicting() -> None:
    manager, pool = _manager(16)
    leases = [manager.start([100 + i], 1) for i in range(16)]
    for le in leases[1::2]:
        manager.release(le, [], 0, insert=False)
    held = leases[::2]  # every other slot taken
    assert pool.available == 8 and not manager.tree.total_size
    lease = manager.start([1, 2, 3], 3, grow=2)  # no run of 5: the ordinary allocation
    assert len(lease.slots) == 3 and not _is_run(lease.slots)
    assert manager.tree.counters.evicted_tokens == 0
    for le in [*held, lease]:
        manager.release(le, [], 0, insert=False)
    manager.check_integrity()


def test_held_decode_slots_go_back_when_another_request_needs_room() -> None:
    manager, pool = _manager(32)
    a = manager.start(list(range(8)), 8, grow=16)
    assert len(a.spare) == 16 and pool.available == 8  # 8 positions + 16 held, 8 free
    b = manager.start(list(range(100, 112)), 12)  # needs 12: only the held slots can give them
    assert len(b.slots) == 12 and a.spare == []
    manager.check_integrity()
    manager.extend(a, 2)  # a decodes on from the pool
    assert len(a.slots) == 10
    manager.check_integrity()
