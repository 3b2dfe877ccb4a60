"""The background writer: bounded queue, drops counted, pending pages served from memory (never
half-read from the store), not advertised before their write ends, flush and close."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

from runtime.cache.tier import KVTier, TierConfig
from runtime.cache.tier.file_store import FileStore
from runtime.cache.tier.store import KVStore
from runtime.cache.tier.writer import PageWriter, snapshot_bytes
from tests.tier.test_tier import FP, _pool


class GatedStore(KVStore):
    """An in-memory store whose puts wait for `gate`: a slow disk or network held still."""

    name = "gated"

    def __init__(self, ok: bool = True) -> None:
        super().__init__()
        self.data: dict[str, bytes] = {}
        self.gate = threading.Event()
        self.entered = threading.Semaphore(0)
        self.ok = ok

    def get(self, key: str) -> bytes | None:
        return self.data.get(key)

    def put(self, key: str, blob: bytes) -> bool:
        self.entered.release()
        self.gate.wait(10)
        if self.ok:
            self.data[key] = blob
        return self.ok

    def contains(self, keys: Sequence[str]) -> list[bool]:
        return [k in self.data for k in keys]

    def delete(self, key: str) -> None:
        self.data.pop(key, None)


def _planes(n: int = 4) -> list[torch.Tensor]:
    return [torch.full((2, 1, n, 4), 1.0), torch.full((2, 1, n, 4), 2.0)]


def _encode(key: str, planes: Sequence[torch.Tensor]) -> bytes:
    return key.encode() + b"".join(p.numpy().tobytes() for p in planes)


def test_queue_is_bounded_in_bytes_and_drops_are_counted():
    store = GatedStore()
    page = snapshot_bytes(_planes())
    w = PageWriter(store, _encode, max_bytes=2 * page)
    assert w.submit("a", _planes()) and w.submit("b", _planes())
    assert not w.submit("c", _planes())  # full: refused at once, never blocking the caller
    s = w.stats()
    assert (s["queued_pages"], s["dropped_pages"], s["queue_bytes"]) == (2, 1, 2 * page)
    assert s["peak_queue_bytes"] == 2 * page
    store.gate.set()
    assert w.flush(10)
    s = w.stats()
    assert (s["written_pages"], s["queue_bytes"]) == (2, 0)
    assert set(store.data) == {"a", "b"}
    assert w.submit("c", _planes())  # room again
    w.close()
    assert "c" in store.data


def test_pending_page_is_served_from_the_queue_and_not_from_the_store():
    store = GatedStore()
    w = PageWriter(store, _encode, max_bytes=10**6)
    planes = _planes()
    w.submit("a", planes)
    assert store.entered.acquire(timeout=10)  # the put is in flight, not finished
    assert "a" not in store.data
    assert w.pending("a") is planes and w.pending_of(["a", "b"]) == [True, False]
    store.gate.set()
    assert w.flush(10)
    assert w.pending("a") is None and "a" in store.data
    w.close()


def test_failed_write_is_neither_pending_nor_stored():
    store = GatedStore(ok=False)
    store.gate.set()
    w = PageWriter(store, _encode, max_bytes=10**6)
    w.submit("a", _planes())
    assert w.flush(10)
    assert w.pending("a") is None and store.contains(["a"]) == [False]
    assert w.stats()["failed_pages"] == 1
    w.close()


def test_close_flushes_the_queue():
    store = GatedStore()
    store.gate.set()
    w = PageWriter(store, _encode, max_bytes=10**6)
    for k in "abcde":
        w.submit(k, _planes())
    w.close(flush=True)
    assert set(store.data) == set("abcde")
    assert not w.submit("f", _planes())  # closed: refused


def test_close_without_flush_drops_what_is_queued_cleanly():
    store = GatedStore()
    w = PageWriter(store, _encode, max_bytes=10**6)
    for k in "abcd":
        w.submit(k, _planes())
    assert store.entered.acquire(timeout=10)  # "a" in flight
    closer = threading.Thread(target=w.close, kwargs={"flush": False, "timeout_s": 10})
    closer.start()
    store.gate.set()
    closer.join(10)
    s = w.stats()
    assert set(store.data) == {"a"}  # the write in flight completes whole; the rest is dropped
    assert (s["dropped_on_close"], s["queue_bytes"]) == (3, 0)


def test_tier_serves_a_page_evicted_but_not_yet_written(tmp_path):
    """The fetch after an eviction must not race the pending write: it is served from the
    queue, bit-identical, while the store still has nothing."""
    pool = _pool()
    store = GatedStore()
    tier = KVTier(store, TierConfig(page_tokens=16), pool, FP)
    tokens, slots = list(range(32)), list(range(40, 72))
    want = [p[:, :, 40:72].clone() for p in pool.planes]
    assert tier.demote("", tokens, slots, start=0) == 2
    for plane in pool.planes:  # the slots are freed and reused: the snapshot must not change
        plane[:, :, 40:72] = 0
    assert store.data == {}
    got = tier.fetch("", tokens, have=0)
    assert got is not None and got.end == 32 and tier.counters.queue_served_pages == 2
    for i, (n, planes) in enumerate(got.chunks()):
        for w, p in zip(want, planes, strict=True):
            assert torch.equal(w[:, :, i * 16 : i * 16 + n], p)
    assert tier.demote("", tokens, slots, start=0) == 0  # pending counts as present: no second copy
    store.gate.set()
    assert tier.flush(10)
    stats = tier.stats()
    assert len(store.data) == 2 and stats["write_queue_bytes"] == 0 and stats["bytes_written"] > 0
    tier.close()


def test_full_queue_drops_the_rest_of_the_prefix(tmp_path):
    pool = _pool()
    store = GatedStore()
    one_page = sum(p[:, :, :16].numel() * p.element_size() for p in pool.planes)
    tier = KVTier(store, TierConfig(page_tokens=16, write_queue_bytes=2 * one_page), pool, FP)
    assert tier.demote("", list(range(64)), list(range(64)), start=0) == 2  # 4 pages, room for 2
    assert tier.counters.dropped_pages == 2
    store.gate.set()
    tier.close()
    assert tier.fetch("", list(range(64)), have=0).end == 32  # the chain stops where it was cut


def test_synchronous_mode_writes_before_returning(tmp_path):
    pool = _pool()
    tier = KVTier(FileStore(tmp_path, 10**8), TierConfig(page_tokens=16, write_queue_bytes=0), pool, FP)
    assert tier.writer is None
    assert tier.demote("", list(range(32)), list(range(32)), start=0) == 2
    assert tier.store.footprint()["entries"] == 2


def test_file_store_under_concurrent_put_and_get(tmp_path):
    """The writer thread puts while the engine thread reads and checks presence."""
    pool = _pool()
    tier = KVTier(FileStore(tmp_path, 10**8), TierConfig(page_tokens=16), pool, FP)
    tokens = list(range(256))
    tier.demote("", tokens, list(range(256)), start=0)
    for _ in range(20):  # while the writes go on, every fetch sees a whole chain
        got = tier.fetch("", tokens, have=0)
        assert got is not None and got.end == 256
    assert tier.flush(10)
    assert tier.store.footprint()["entries"] == 16
    assert tier.fetch("", tokens, have=0).end == 256
    tier.close()
