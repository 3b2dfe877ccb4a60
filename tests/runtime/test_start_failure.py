"""A request that fails while taking its KV view releases what it locked or took."""

from __future__ import annotations

import pytest


def test_a_request_that_fails_to_start_errors_and_the_engine_keeps_serving(engine, monkeypatch):
    buffers = engine.manager.kv
    real_take = buffers.take

    def broken(slots, cached):
        monkeypatch.setattr(buffers, "take", real_take)  # fail once
        raise RuntimeError("injected start failure")

    ids = engine.tokenize("The injected failure test prompt, long enough to share a prefix with the next.")
    params = {"temperature": 0, "max_new_tokens": 4}
    engine.generate(
        input_ids=ids, sampling_params=params
    )  # cache the prompt: the failure happens with a lock held
    monkeypatch.setattr(buffers, "take", broken)
    with pytest.raises(RuntimeError, match="injected start failure"):
        engine.generate(input_ids=ids, sampling_params=params)
    again = engine.generate(input_ids=ids, sampling_params=params)
    assert again["meta_info"]["cached_tokens"] == len(ids) - 1
    engine.check_integrity()  # no leaked lock, no lost slot
