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

import torch

KEY_VERSION = b"radixagent-kv-1"


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


def weights_digest(tensors: Iterable[tuple[str, torch.Tensor]]) -> bytes:
    """A digest of every byte of every weight tensor (name, shape, dtype and data), in name order.
    A sample of each tensor missed swaps that keep it (a LoRA merge keeps the norms; 512 tokens were
    served from pages of the old weights): hashing all ~0.5 GB takes well under a second, once at
    start-up and once per weights swap. Tensors are (name, tensor) pairs; a tensor reached under
    two names (tied weights) is hashed under each."""
    h = hashlib.blake2b(digest_size=20)
    for name, t in sorted(tensors, key=lambda kv: kv[0]):
        if not isinstance(t, torch.Tensor):
            continue
        h.update(f"{name}|{tuple(t.shape)}|{t.dtype}".encode())
        flat = t.detach().reshape(-1).contiguous().view(torch.uint8).cpu()
        h.update(flat.numpy().data)
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
