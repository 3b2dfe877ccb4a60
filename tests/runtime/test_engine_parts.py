"""The engine's side concerns (runtime/engine/build.py, stats.py, tier.py) on a tiny
random model: no model file is loaded, so these run in the fast suite."""

from __future__ import annotations

import pytest
import torch

from evals.benchmarks.bench_gpu import IdTokenizer
from runtime import Engine
from runtime.engine.build import sibling_config
from runtime.engine.tier import FLAT_STATS, on_session_event
from runtime.errors import InvalidRequest, UnknownSession
from runtime.model.model import LlamaModel
from tests.runtime.test_forward import TINY

GREEDY = {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}


@pytest.fixture
def tiered(tmp_path):
    model = LlamaModel.random(TINY, torch.float32, "cpu")
    eng = Engine.from_model(
        model,
        IdTokenizer(),
        "tiny",
        max_total_tokens=512,
        enable_hierarchical_cache=True,
        hicache_storage_dir=str(tmp_path),
        hicache_page_tokens=16,
    )
    yield eng
    eng.shutdown()


class RecordingTier:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def schedule(self, key: str, delay_s: float) -> float:
        self.calls.append(("schedule", key, delay_s))
        return delay_s

    def cancel(self, key: str) -> None:
        self.calls.append(("cancel", key))


@pytest.mark.parametrize(
    "event,expected_s,calls,wake",
    [
        ("tool_wait", 2.5, [("schedule", "k", 2.5)], True),
        ("tool_wait", None, [], False),  # no expected duration: nothing to time a prefetch to
        ("resume", None, [("schedule", "k", 0.0)], True),
        ("close", None, [("cancel", "k")], False),
        ("abandon", None, [("cancel", "k")], False),
        ("open", None, [], False),
    ],
)
def test_session_events_map_to_prefetch_schedule_or_cancel(event, expected_s, calls, wake):
    tier = RecordingTier()
    assert on_session_event(tier, "k", event, expected_s) is wake  # type: ignore[arg-type]
    assert tier.calls == calls


def test_a_sibling_cannot_change_the_shared_weights(tiered):
    with pytest.raises(InvalidRequest, match="shares the weights"):
        sibling_config(tiered.config, {"dtype": "bfloat16"})
    assert sibling_config(tiered.config, {"max_queue": 3}).max_queue == 3


def test_stats_snapshot_and_model_info_read_the_built_parts(tiered):
    ids = list(range(10, 60))
    tiered.generate(input_ids=ids, sampling_params=GREEDY)
    again = tiered.generate(input_ids=ids, sampling_params=GREEDY)
    assert again["meta_info"]["cached_tokens"] == len(ids) - 1
    stats = tiered.get_cache_stats()
    assert stats["requests"] == 2 and stats["prompt_tokens"] == 2 * len(ids)
    assert stats["pool_capacity_tokens"] == tiered.pool.size == 512
    assert stats["kv_bytes_per_token"] == tiered.kv_bytes_per_token
    assert stats["tokens_in_use"] == tiered.cache.total_size > 0
    assert {f"tier_{k}" for k in FLAT_STATS} <= stats.keys()
    assert stats["tier"]["backend"] == "file" and stats["tier"]["page_tokens"] == 16
    snap = tiered.snapshot(check=True)
    assert snap.integrity_error is None and snap.running == snap.waiting == 0
    assert snap.cache.tokens_in_use == stats["tokens_in_use"] and snap.stats["requests"] == 2
    info = tiered.model_info
    assert info["vocab_size"] == TINY.vocab_size and info["served_model_name"] == "tiny"
    assert info["context_length"] == TINY.max_positions and info["dtype"] == "float32"


def test_session_events_reach_the_registry_and_the_tier_prefetch(tiered):
    with pytest.raises(UnknownSession, match="'s1' is not open"):
        tiered.session_event("s1", "tool_wait", expected_s=30.0)
    tiered.session_event("s1", "open", cache_salt="tenant")
    assert tiered.session_is_open("s1", "tenant") and not tiered.session_is_open("s1")
    tiered.session_event("s1", "tool_wait", expected_s=30.0, cache_salt="tenant")
    due = tiered.tier.next_due_in()
    assert due is not None and 25.0 < due <= 30.0
    tiered.session_event("s1", "close", cache_salt="tenant")
    assert tiered.tier.next_due_in() is None
    assert not tiered.session_is_open("s1", "tenant")
