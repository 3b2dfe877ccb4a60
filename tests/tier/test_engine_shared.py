"""Shared tier on a private redis-server (two engines = two workers), Redis outages, and
session-aware movement (prefetch before a tool returns; dead sessions dropped, not demoted)."""

from __future__ import annotations

import logging
import time

import pytest
from redis_util import running_redis
from test_engine_tier import GREEDY, evict_all, stored_len, tiered


@pytest.fixture
def redis_server(tmp_path):
    yield from running_redis(tmp_path)


pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prompt(engine) -> list[int]:
    from tests.runtime.conftest import essay_text

    return engine.tokenize(essay_text())[:400]


@pytest.fixture(scope="module")
def cold(engine, prompt) -> list[int]:
    return engine.generate(input_ids=prompt, sampling_params=GREEDY, prefix_cache=False)["output_ids"]


SHARED_KEY = "a-test-key-shared-by-both-workers"


def redis_worker(engine, tmp_path, url):
    # workers of one shared tier share its MAC key (`radixagent cluster` hands one to its workers)
    return tiered(
        engine, tmp_path, hicache_storage_backend="redis", hicache_storage_url=url, hicache_mac_key=SHARED_KEY
    )


def test_second_worker_hits_what_the_first_demoted(engine, tmp_path, redis_server, prompt, cold):
    a, b = redis_worker(engine, tmp_path, redis_server.url), redis_worker(engine, tmp_path, redis_server.url)
    try:
        a.generate(input_ids=prompt, sampling_params=GREEDY, cache_salt="t1")
        evict_all(a)
        other_tenant = b.generate(input_ids=prompt, sampling_params=GREEDY, cache_salt="t2")
        assert other_tenant["meta_info"]["cached_tokens"] == 0
        hit = b.generate(input_ids=prompt, sampling_params=GREEDY, cache_salt="t1")
        assert hit["meta_info"]["cached_tokens_details"] == {
            "device": 0,
            "host": 0,
            "storage": stored_len(prompt),
            "storage_backend": "redis",
        }
        assert hit["output_ids"] == cold
        b.check_integrity()
    finally:
        a.shutdown()
        b.shutdown()


def test_redis_down_then_restarted_mid_run(engine, tmp_path, redis_server, prompt, cold, caplog):
    a, b = redis_worker(engine, tmp_path, redis_server.url), redis_worker(engine, tmp_path, redis_server.url)
    try:
        a.generate(input_ids=prompt, sampling_params=GREEDY)
        redis_server.stop()
        with caplog.at_level(logging.WARNING, "radixagent.tier"):
            evict_all(a)  # the demotion fails: warned, not raised
            r = b.generate(input_ids=prompt, sampling_params=GREEDY)
        assert r["meta_info"]["cached_tokens"] == 0 and r["output_ids"] == cold
        assert 1 <= len([m for m in caplog.messages if "redis tier" in m]) <= 2  # once per kind (put, exists)
        redis_server.start()  # back, empty: nothing stale can be served
        for eng in (a, b):
            eng.tier.tier.store._down_until = 0.0  # skip the retry back-off in the test
        evict_all(b)
        again = a.generate(input_ids=prompt, sampling_params=GREEDY)
        assert again["meta_info"]["cached_tokens_details"]["storage"] == stored_len(prompt)
        assert again["output_ids"] == cold
    finally:
        a.shutdown()
        b.shutdown()


@pytest.mark.parametrize("prefetch", [True, False])
def test_prefetch_before_the_tool_returns(engine, tmp_path, prompt, prefetch):
    eng = tiered(engine, tmp_path, hicache_prefetch=prefetch, radix_eviction_policy="session")
    try:
        first = eng.generate(input_ids=prompt, sampling_params=GREEDY, session_id="s1")
        context = prompt + first["output_ids"]
        evict_all(eng)
        eng.session_event("s1", "tool_wait", expected_s=0.7)  # prefetch due 0.5 s before: at 0.2 s
        time.sleep(1.5)
        resident = eng.cache.cached_length(context)
        pages = (len(context) - 1) // 64 * 64
        assert resident == (pages if prefetch else 0)
        eng.session_event("s1", "resume")
        nxt = eng.generate(input_ids=context + [198, 42], sampling_params=GREEDY, session_id="s1")
        details = nxt["meta_info"]["cached_tokens_details"]
        assert details["storage"] == (0 if prefetch else pages)
        assert nxt["meta_info"]["cached_tokens"] == pages
        assert eng.get_cache_stats()["tier_prefetched_tokens"] == (pages if prefetch else 0)
        eng.check_integrity()
    finally:
        eng.shutdown()


def test_closed_session_is_dropped_not_demoted(engine, tmp_path, prompt):
    eng = tiered(engine, tmp_path, radix_eviction_policy="session")
    try:
        eng.generate(input_ids=prompt, sampling_params=GREEDY, session_id="gone")
        eng.session_event("gone", "close")
        evict_all(eng)
        stats = eng.get_cache_stats()["tier"]
        assert stats["demoted_pages"] == 0 and stats["dropped_tokens"] > 0
        assert not list(tmp_path.rglob("*.kv"))
    finally:
        eng.shutdown()
