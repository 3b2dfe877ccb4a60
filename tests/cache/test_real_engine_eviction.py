"""Session-aware eviction in the real embedded engine (real model, real KV pool).

Two sessions and a session-less request fill a small pool; one session closes; the next request
forces an eviction. `session` evicts the closed session's nodes first, so the live session still
hits; `lru` (reference) evicts the oldest, which is the live session.
"""

from __future__ import annotations

import random

import pytest

N = 200  # tokens per prompt
POOL = 720  # holds three prompts (+ outputs), not four


def _ids(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 20000) for _ in range(N)]


def _gen(eng, ids: list[int], session_id: str | None = None) -> dict:
    return eng.generate(
        input_ids=ids, sampling_params={"max_new_tokens": 2, "temperature": 0.0}, session_id=session_id
    )["meta_info"]


def _scenario(eng) -> tuple[dict, dict]:
    live, dead = _ids(1), _ids(2)
    _gen(eng, live, "live")
    eng.session_event("live", "tool_wait", tool="search", expected_s=60.0)
    _gen(eng, dead, "dead")
    eng.session_event("dead", "close")
    _gen(eng, _ids(3))
    _gen(eng, _ids(4))  # forces eviction
    eng.check_integrity()
    return _gen(eng, live + [7, 8, 9], "live"), _gen(eng, dead + [7, 8, 9])


@pytest.mark.parametrize("policy", ["session", "lru"])
def test_closed_session_evicted_first(engine, policy) -> None:
    eng = engine.sibling(radix_eviction_policy=policy, max_total_tokens=POOL)
    try:
        live, dead = _scenario(eng)
        stats = eng.get_cache_stats()
        eng.check_integrity()
    finally:
        eng.shutdown()
    assert stats["evicted_tokens"] > 0
    if policy == "session":
        assert live["cached_tokens"] >= N, live
        assert dead["cached_tokens"] < N // 2, dead
    else:
        assert live["cached_tokens"] < N // 2, live  # LRU drops the oldest: the live session
