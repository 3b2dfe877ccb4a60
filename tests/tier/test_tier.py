"""KVTier over a real KVPool (no model): pages written from slots come back bit-identical."""

from __future__ import annotations

import pytest
import torch

from runtime.cache.kv_format import KVFormat
from runtime.cache.kv_pool import KVPool
from runtime.cache.tier import KVTier, TierConfig
from runtime.cache.tier.file_store import FileStore
from runtime.cache.tier.keys import Fingerprint

FP = Fingerprint.of("m", "float32", (2, 1, 4), b"w")


def _pool(fmt="float32", size=256):
    f = KVFormat.resolve(fmt, torch.float32, torch.float32)
    pool = KVPool(size, 2, 1, 4, f, "cpu")
    g = torch.Generator().manual_seed(1)
    for plane in pool.planes:
        plane.copy_(torch.randn(plane.shape, generator=g).to(plane.dtype))
    return pool


def _tier(tmp_path, pool, page=16):
    return KVTier(FileStore(tmp_path, 10**8), TierConfig(page_tokens=page), pool, FP)


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "int8"])
def test_demote_then_fetch_is_bit_identical(tmp_path, fmt):
    pool = _pool(fmt)
    tier = _tier(tmp_path, pool)
    tokens, slots = list(range(50)), list(range(100, 150))
    assert tier.demote("", tokens, slots, start=0) == 3  # 3 full pages of 16; the last 2 tokens are not kept
    assert tier.demote("", tokens, slots, start=0) == 0  # already stored
    got = tier.fetch("", tokens, have=20)
    assert (got.have, got.end, got.skip, len(got.pages)) == (20, 48, 4, 2)
    pos = 20
    for n, planes in got.chunks():
        for plane, page_plane in zip(pool.planes, planes, strict=True):
            assert torch.equal(plane[:, :, slots[pos] : slots[pos] + n], page_plane)
        pos += n
    assert pos == 48


def test_fetch_stops_at_first_missing_or_corrupt_page(tmp_path):
    pool = _pool()
    tier = _tier(tmp_path, pool)
    tokens, slots = list(range(64)), list(range(64))
    tier.demote("", tokens, slots, start=0)
    assert tier.flush(10)
    keys = tier.keys("", tokens)
    path = tier.store._path(keys[2])
    path.write_bytes(path.read_bytes()[:-10])  # truncated third page
    got = tier.fetch("", tokens, have=0)
    assert got.end == 32 and tier.counters.corrupt_pages == 1
    assert not path.exists()  # the bad entry is removed, not retried forever
    tier.store.delete(keys[0])
    assert tier.fetch("", tokens, have=0) is None  # without page 0 nothing after it is reachable


def test_other_namespace_or_fingerprint_never_loads(tmp_path):
    pool = _pool()
    tier = _tier(tmp_path, pool)
    tokens = list(range(32))
    tier.demote("tenant-a", tokens, list(range(32)), start=0)
    assert tier.fetch("tenant-b", tokens, have=0) is None
    assert tier.fetch("", tokens, have=0) is None
    assert tier.fetch("tenant-a", tokens, have=0).end == 32
    tier.set_fingerprint(Fingerprint.of("m", "float32", (2, 1, 4), b"other weights"))
    assert tier.fetch("tenant-a", tokens, have=0) is None


def test_demote_only_pages_overlapping_start(tmp_path):
    tier = _tier(tmp_path, _pool())
    tokens = list(range(64))
    assert tier.demote("", tokens, list(range(64)), start=40) == 2  # pages 2 and 3
    assert tier.fetch("", tokens, have=0) is None  # page 0 was never stored
    assert tier.fetch("", tokens, have=32).end == 64


def test_format_mismatch_is_rejected(tmp_path):
    tier = _tier(tmp_path, _pool("float32"))
    tokens = list(range(16))
    tier.demote("", tokens, list(range(16)), start=0)
    assert tier.flush(10)
    other = KVTier(tier.store, TierConfig(page_tokens=16), _pool("bfloat16"), FP)
    assert other.fetch("", tokens, have=0) is None
    assert other.counters.corrupt_pages == 1


def test_config_validates():
    with pytest.raises(ValueError, match="hicache_storage_backend"):
        TierConfig(backend="mooncake")
    with pytest.raises(ValueError, match="hicache_write_policy"):
        TierConfig(write_policy="sometimes")


def test_prefetch_starts_early_by_the_measured_load_time(tmp_path):
    from runtime.cache.tier.hooks import TierHooks

    hooks = TierHooks(_tier(tmp_path, _pool()))
    hooks.remember("s", "", list(range(2000)))
    assert hooks.schedule("s", 5.0) == 4.5  # nothing loaded yet: the fixed lead only
    hooks.tier.counters.loaded_tokens, hooks.tier.counters.load_time_s = 1000, 0.5
    assert hooks.load_estimate_s("s") == 1.0
    assert hooks.schedule("s", 5.0) == 2.5  # 5 - 0.5 lead - 2 x 1.0 s estimated load
    assert hooks.schedule("s", 1.0) == 0.0  # never in the past
    assert hooks.schedule("unknown", 5.0) == 4.5


def test_prefetch_without_room_is_retried_until_the_expected_return(tmp_path, monkeypatch):
    import time
    from types import SimpleNamespace

    from runtime.cache.tier import hooks as hooks_mod
    from runtime.cache.tier.hooks import TierHooks

    hooks = TierHooks(_tier(tmp_path, _pool()))
    calls = []
    monkeypatch.setattr(hooks, "extend", lambda *a, **k: calls.append(a) or 64)
    monkeypatch.setattr(hooks_mod, "PREFETCH_RETRY_S", 0.01)
    cache = SimpleNamespace(cached_length=lambda ids, ns: 0)
    pool = SimpleNamespace(available=0)  # a running request holds every slot (the manager's room())
    hooks.remember("s", "", list(range(64)))
    hooks.schedule("s", 0.6)  # due now (0.6 - 0.5 lead ~ 0.1 s), retried until 0.6 s
    time.sleep(0.15)
    assert hooks.run_due(cache, None, lambda: pool.available) == 0 and not calls
    assert hooks.tier.counters.prefetch_retries == 1 and hooks.next_due_in() is not None
    pool.available = 64  # the request finished
    time.sleep(0.02)
    assert hooks.run_due(cache, None, lambda: pool.available) == 64 and len(calls) == 1
    assert hooks.next_due_in() is None
    hooks.schedule("s", 0.0)  # resume with no room: one try, no retry past the return
    assert hooks.run_due(cache, None, lambda: 0) == 0
    assert hooks.next_due_in() is None
