"""The KV tier in the real engine: reload instead of recompute, identical outputs, isolation,
restart safety and faults (nothing stale or corrupt is ever served)."""

from __future__ import annotations

import logging

import pytest

from runtime.errors import InvalidRequest

pytestmark = pytest.mark.slow
GREEDY = {"temperature": 0, "max_new_tokens": 6}
PAGE = 64


@pytest.fixture(scope="module")
def prompt(engine) -> list[int]:
    from tests.runtime.conftest import essay_text

    return engine.tokenize(essay_text())[:400]


@pytest.fixture(scope="module")
def cold(engine, prompt) -> list[int]:
    return engine.generate(input_ids=prompt, sampling_params=GREEDY, prefix_cache=False)["output_ids"]


def tiered(engine, tmp_path, **kw):
    cfg = {"enable_hierarchical_cache": True, "hicache_storage_dir": str(tmp_path), "max_total_tokens": 2048}
    return engine.sibling(**(cfg | kw))


def evict_all(eng, flush: bool = True) -> None:
    """Evict everything; with `flush`, wait for the background writer to store the pages."""
    with eng.scheduler.lock:
        eng.cache.evict(eng.cache.evictable_size)
    if flush and eng.tier is not None:
        assert eng.tier.tier.flush(60), "tier writer did not drain"


def stored_len(prompt) -> int:
    return (len(prompt) - 1) // PAGE * PAGE  # the last prompt token is never served


def test_reload_serves_stored_pages_with_identical_output(engine, tmp_path, prompt, cold):
    eng = tiered(engine, tmp_path)
    try:
        first = eng.generate(input_ids=prompt, sampling_params=GREEDY)
        assert first["meta_info"]["cached_tokens"] == 0
        evict_all(eng)
        assert eng.cache.total_size == 0
        again = eng.generate(input_ids=prompt, sampling_params=GREEDY)
        meta = again["meta_info"]
        assert meta["cached_tokens"] == stored_len(prompt)
        assert meta["cached_tokens_details"] == {
            "device": 0,
            "host": 0,
            "storage": stored_len(prompt),
            "storage_backend": "file",
        }
        assert again["output_ids"] == first["output_ids"] == cold
        third = eng.generate(input_ids=prompt, sampling_params=GREEDY)  # now resident: from the pool
        assert third["meta_info"]["cached_tokens_details"]["storage"] == 0
        assert third["meta_info"]["cached_tokens"] == len(prompt) - 1
        stats = eng.get_cache_stats()
        assert stats["tier_loaded_tokens"] == stored_len(prompt) and stats["tier_hits"] == 1
        assert stats["tier_bytes_read"] > stored_len(prompt) * eng.kv_bytes_per_token
        eng.check_integrity()
    finally:
        eng.shutdown()


def test_reload_right_after_eviction_races_no_write(engine, tmp_path, prompt, cold):
    """The writer may still hold the pages: the next request is served from its queue or the
    store, never from a half-written entry; shutdown writes whatever is left."""
    eng = tiered(engine, tmp_path)
    try:
        eng.generate(input_ids=prompt, sampling_params=GREEDY)
        evict_all(eng, flush=False)
        again = eng.generate(input_ids=prompt, sampling_params=GREEDY)
        assert again["meta_info"]["cached_tokens_details"]["storage"] == stored_len(prompt)
        assert again["output_ids"] == cold
        evict_all(eng, flush=False)  # already stored or queued: nothing is written twice
        writer = eng.get_cache_stats()["tier"]["writer"]
        assert writer["queued_pages"] == stored_len(prompt) // PAGE and writer["dropped_pages"] == 0
    finally:
        eng.shutdown()
    assert len(list(tmp_path.rglob("*.kv"))) == stored_len(prompt) // PAGE  # flushed at shutdown


def test_synchronous_writes_still_work(engine, tmp_path, prompt, cold):
    eng = tiered(engine, tmp_path, hicache_write_queue_mb=0)
    try:
        eng.generate(input_ids=prompt, sampling_params=GREEDY)
        evict_all(eng, flush=False)
        # written before evict returned
        assert len(list(tmp_path.rglob("*.kv"))) == stored_len(prompt) // PAGE
        assert "writer" not in eng.get_cache_stats()["tier"]
        assert eng.generate(input_ids=prompt, sampling_params=GREEDY)["output_ids"] == cold
    finally:
        eng.shutdown()


def test_other_salt_never_loads_and_restart_reloads(engine, tmp_path, prompt, cold):
    eng = tiered(engine, tmp_path)
    try:
        eng.generate(input_ids=prompt, sampling_params=GREEDY, cache_salt="tenant-a")
        evict_all(eng)
        other = eng.generate(input_ids=prompt, sampling_params=GREEDY, cache_salt="tenant-b")
        assert other["meta_info"]["cached_tokens"] == 0 and eng.get_cache_stats()["tier_loaded_tokens"] == 0
        unsalted = eng.generate(input_ids=prompt, sampling_params=GREEDY)
        assert unsalted["meta_info"]["cached_tokens"] == 0
    finally:
        eng.shutdown()
    restarted = tiered(engine, tmp_path)  # a new engine over the same directory
    try:
        hit = restarted.generate(input_ids=prompt, sampling_params=GREEDY, cache_salt="tenant-a")
        assert hit["meta_info"]["cached_tokens_details"]["storage"] == stored_len(prompt)
        assert hit["output_ids"] == cold
    finally:
        restarted.shutdown()


def test_other_kv_dtype_never_loads(engine, tmp_path, prompt):
    eng = tiered(engine, tmp_path)
    try:
        eng.generate(input_ids=prompt, sampling_params=GREEDY)
        evict_all(eng)
    finally:
        eng.shutdown()
    bf16 = tiered(engine, tmp_path, kv_cache_dtype="bfloat16")
    try:
        r = bf16.generate(input_ids=prompt, sampling_params=GREEDY)
        assert r["meta_info"]["cached_tokens"] == 0  # the fingerprint differs: other keys
    finally:
        bf16.shutdown()


def test_truncated_entries_are_recomputed_not_served(engine, tmp_path, prompt, cold, caplog):
    eng = tiered(engine, tmp_path)
    try:
        eng.generate(input_ids=prompt, sampling_params=GREEDY)
        evict_all(eng)
        files = sorted(tmp_path.rglob("*.kv"))
        assert len(files) == len(prompt) // PAGE
        for f in files:
            f.write_bytes(f.read_bytes()[:-100])
        with caplog.at_level(logging.WARNING, "radixagent.tier"):
            r = eng.generate(input_ids=prompt, sampling_params=GREEDY)
        assert r["meta_info"]["cached_tokens"] == 0 and r["output_ids"] == cold
        assert eng.get_cache_stats()["tier_corrupt_pages"] == 1  # the first bad page ends the chain
        assert len([m for m in caplog.messages if "rejected" in m]) == 1
        eng.check_integrity()
    finally:
        eng.shutdown()


def test_unusable_directory_still_serves(engine, tmp_path, prompt, cold, caplog):
    blocker = tmp_path / "tier"
    blocker.write_text("a file, not a directory")
    with caplog.at_level(logging.WARNING, "radixagent.tier"):
        eng = tiered(engine, blocker)
        try:
            for _ in range(2):
                eng.generate(input_ids=prompt, sampling_params=GREEDY)
                evict_all(eng)
            r = eng.generate(input_ids=prompt, sampling_params=GREEDY)
            assert r["meta_info"]["cached_tokens"] == 0 and r["output_ids"] == cold
            assert eng.get_cache_stats()["tier"]["write_failures"] >= 2
        finally:
            eng.shutdown()
    assert len([m for m in caplog.messages if "cannot write" in m]) == 1


def test_weights_change_makes_old_pages_unreachable(engine, tmp_path, prompt):
    from runtime.cache.tier.hooks import model_fingerprint
    from runtime.model.model import LlamaModel

    fp = model_fingerprint(engine.model, "m", "float32")
    other = LlamaModel.random(engine.model.cfg, engine.model.dtype, "cpu", seed=1)
    assert model_fingerprint(other, "m", "float32") != fp
    assert model_fingerprint(engine.model, "m", "float32") == fp


def test_config_errors_name_the_field(engine):
    with pytest.raises(ValueError, match="hicache_storage_dir"):
        engine.sibling(enable_hierarchical_cache=True)
    with pytest.raises(ValueError, match="hicache_storage_backend"):
        engine.sibling(enable_hierarchical_cache=True, hicache_storage_backend="mooncake")
    assert issubclass(InvalidRequest, ValueError)
