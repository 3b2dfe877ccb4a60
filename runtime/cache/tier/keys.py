"""Store keys: a hash chain over pages of tokens, rooted in the model fingerprint and namespace.

key(page i) = H(key(page i-1) || tokens of page i), key(page -1) = H(fingerprint || namespace).
A key therefore names the whole token prefix up to the end of its page, for one tenant (the
namespace is the `cache_salt` digest) under one set of weights and KV format: two tenants, two
models or two KV dtypes never share a key, and a page is only ever found after every page
before it (lookups walk the chain from the start).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

KEY_VERSION = b"radixagent-kv-1"
#: elements sampled from the start and the end of every weight tensor for the fingerprint
_SAMPLE = 2048


def _digest(*parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=20)
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.digest()


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """What a stored page's bytes depend on besides the tokens. `hex` goes into every key."""

    hex: str

    @classmethod
    def of(cls, model_name: str, kv_format: str, geometry: Sequence[int], weights: bytes) -> Fingerprint:
        desc = f"{model_name}|kv={kv_format}|geom={','.join(map(str, geometry))}".encode()
        return cls(_digest(KEY_VERSION, desc, weights).hex())


def weights_digest(tensors: Iterable[tuple[str, Any]]) -> bytes:
    """A digest of the weights that reads a sample of every tensor (name, shape, dtype, first and
    last elements) instead of all ~0.5 GB: cheap at start-up and after a weights swap, and any
    real retrain or other checkpoint changes it. Tensors are (name, tensor) pairs."""
    h = hashlib.blake2b(digest_size=20)
    for name, t in sorted(tensors, key=lambda kv: kv[0]):
        if not isinstance(t, torch.Tensor):
            continue
        flat = t.detach().reshape(-1)
        head, tail = flat[:_SAMPLE], flat[-_SAMPLE:]
        h.update(f"{name}|{tuple(t.shape)}|{t.dtype}".encode())
        for part in (head, tail):
            h.update(part.contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.digest()


def page_keys(fingerprint: Fingerprint, namespace: str, tokens: Sequence[int], page: int) -> list[str]:
    """Keys of every full page of `tokens` (len(tokens) // page of them), in order."""
    if page <= 0:
        raise ValueError("page size must be positive")
    prev = _digest(fingerprint.hex.encode(), namespace.encode())
    out = []
    data = torch.tensor(list(tokens[: len(tokens) // page * page]), dtype=torch.int64).numpy().tobytes()
    width = 8 * page
    for start in range(0, len(data), width):
        prev = _digest(prev, data[start : start + width])
        out.append(prev.hex())
    return out
