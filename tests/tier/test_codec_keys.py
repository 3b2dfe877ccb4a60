from __future__ import annotations

import pytest
import torch

from runtime.cache.tier import codec
from runtime.cache.tier.keys import Fingerprint, page_keys, weights_digest
from runtime.cache.tier.store import CorruptEntry

FP = Fingerprint.of("m", "float32", (2, 1, 4), b"w")
KEY = bytes(range(32))  # the tier's MAC key


def _planes(n=8, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 1, n, 4, generator=g).to(dtype) for _ in range(2)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_roundtrip_is_exact(dtype):
    planes = _planes(dtype=dtype)
    blob = codec.encode("k1", "x", planes, KEY)
    back = codec.decode("k1", "x", bytearray(blob), KEY)
    assert all(torch.equal(a, b) for a, b in zip(planes, back, strict=True))
    back = codec.decode("k1", "x", blob, KEY)  # read-only bytes are copied, not rejected
    assert torch.equal(back[0], planes[0])


def test_int8_with_scales_roundtrip():
    planes = [torch.randint(-127, 127, (2, 1, 8, 4), dtype=torch.int8) for _ in range(2)]
    planes += [torch.rand(2, 1, 8, 1) for _ in range(2)]
    back = codec.decode("k", "int8", codec.encode("k", "int8", planes, KEY), KEY)
    assert [p.dtype for p in back] == [torch.int8, torch.int8, torch.float32, torch.float32]
    assert all(torch.equal(a, b) for a, b in zip(planes, back, strict=True))


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[:-1],  # truncated
        lambda b: b[: len(b) // 2],
        lambda b: b[:6],  # header cut
        lambda b: b"",
        lambda b: b[:-3] + bytes([b[-3] ^ 1]) + b[-2:],  # a flipped bit
        lambda b: b"XXXX" + b[4:],
        lambda b: b + b"\0",
    ],
)
def test_damaged_entries_are_rejected(damage):
    blob = codec.encode("k1", "x", _planes(), KEY)
    with pytest.raises(CorruptEntry):
        codec.decode("k1", "x", damage(blob), KEY)


def test_wrong_key_or_format_is_rejected():
    blob = codec.encode("k1", "float32", _planes(), KEY)
    with pytest.raises(CorruptEntry, match="key"):
        codec.decode("k2", "float32", blob, KEY)
    with pytest.raises(CorruptEntry, match="format"):
        codec.decode("k1", "bfloat16", blob, KEY)


def test_keys_chain_and_isolation():
    toks = list(range(100))
    keys = page_keys(FP, "", toks, 32)
    assert len(keys) == 3  # the partial last page has no key
    assert page_keys(FP, "", toks[:64], 32) == keys[:2]  # a prefix's keys are a prefix
    changed = page_keys(FP, "", [7] + toks[1:], 32)
    assert all(a != b for a, b in zip(keys, changed, strict=True))  # later pages depend on earlier ones
    assert set(page_keys(FP, "tenant-a", toks, 32)).isdisjoint(keys)  # salts never share
    other = Fingerprint.of("m", "bfloat16", (2, 1, 4), b"w")
    assert set(page_keys(other, "", toks, 32)).isdisjoint(keys)  # nor KV formats


def test_weights_digest_sees_a_change():
    w = {"a": torch.zeros(10), "b": torch.ones(5000)}
    d0 = weights_digest(w.items())
    w["b"][-1] = 2.0
    assert weights_digest(w.items()) != d0
    assert weights_digest(list(w.items())[::-1]) == weights_digest(w.items())  # order-free
