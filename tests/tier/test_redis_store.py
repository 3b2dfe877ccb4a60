from __future__ import annotations

import logging

import pytest
from redis_util import running_redis

from runtime.cache.tier.redis_store import RedisStore


@pytest.fixture
def redis_server(tmp_path):
    yield from running_redis(tmp_path)


def test_put_get_contains(redis_server):
    s = RedisStore(redis_server.url, prefix="t:")
    assert s.put("k1", b"abc")
    assert s.get("k1") == b"abc"
    assert s.get("k2") is None
    assert s.contains(["k1", "k2"]) == [True, False]
    assert s.prefix_hits(["k1", "k2", "k1"]) == 1
    s.delete("k1")
    assert s.get("k1") is None
    assert s.footprint()["bytes"] > 0


def test_down_and_restarted_never_raises(redis_server, caplog):
    now = [0.0]
    s = RedisStore(redis_server.url, prefix="t:", timeout_s=0.5, retry_s=1.0, clock=lambda: now[0])
    assert s.put("k1", b"abc")
    redis_server.stop()
    with caplog.at_level(logging.WARNING, "radixagent.tier"):
        assert s.get("k1") is None
        assert not s.put("k2", b"x")  # within retry_s: not even tried
        assert s.contains(["k1"]) == [False]
    assert len(caplog.records) == 1  # one warning for the outage
    redis_server.start()  # same port, empty (no persistence): nothing stale survives
    now[0] += 5.0
    assert s.get("k1") is None
    assert s.put("k2", b"xyz") and s.get("k2") == b"xyz"


def test_prefixes_separate_stores(redis_server):
    a, b = RedisStore(redis_server.url, prefix="a:"), RedisStore(redis_server.url, prefix="b:")
    assert a.put("k", b"1")
    assert b.get("k") is None
