"""Request KV buffers are recycled: reused when they fit, bounded in bytes, never handed out twice."""

from __future__ import annotations

import pytest
import torch

from runtime.model import SpareBuffers
from tests.runtime.test_forward import TINY


def test_a_parked_buffer_is_reused_when_it_fits():
    spare = SpareBuffers(TINY, torch.float32, "cpu", max_bytes=2**30)
    a = spare.take(300)
    assert a.capacity == 512  # rounded up to a multiple of 256
    a.length = 290
    spare.give(a)
    b = spare.take(400)
    assert b is a and b.length == 0
    assert spare.take(100) is not a  # handed out already: a new one
    spare.give(b)
    assert spare.take(5000).capacity == 5120  # too small to serve: a new buffer, the old one stays parked
    assert spare.parked == 1


def test_tiny_requests_do_not_pin_huge_buffers_and_bytes_are_bounded():
    big = SpareBuffers(TINY, torch.float32, "cpu", max_bytes=2**30)
    huge = big.take(4000)
    big.give(huge)
    assert big.take(10) is not huge
    one = SpareBuffers(TINY, torch.float32, "cpu", max_bytes=0).take(256).nbytes
    bounded = SpareBuffers(TINY, torch.float32, "cpu", max_bytes=2 * one)
    buffers = [bounded.take(256) for _ in range(4)]
    for b in buffers:
        bounded.give(b)
    assert bounded.parked == 2


def test_take_picks_among_several_parked_buffers():
    spare = SpareBuffers(TINY, torch.float32, "cpu", max_bytes=2**30)
    small, large = spare.take(200), spare.take(500)
    spare.give(small)
    spare.give(large)
    assert spare.take(400) is large and spare.take(100) is small


def test_a_request_that_fails_to_start_errors_and_the_engine_keeps_serving(engine, monkeypatch):
    buffers = engine.request_kv.spare
    real_take = buffers.take

    def broken(capacity):
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
