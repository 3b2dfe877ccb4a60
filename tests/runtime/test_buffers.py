"""Request KV buffers are recycled: reused when they fit, bounded in bytes, never handed out twice."""

from __future__ import annotations

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
