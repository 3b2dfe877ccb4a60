"""Block hashes as SGLang 0.5.23 computes them for KV events (written from its documented
behaviour: sglang/srt/mem_cache/utils.py, events.py, cpp_utils/hash_binding.cpp).

A prompt is cut into pages of `block_size` tokens. Page i's digest is
SHA-256(previous page's 32-byte digest, if any || the page's token ids as little-endian uint32);
a page holding a token id above 2**32 - 1 hashes the byte 0xff then the ids as little-endian
uint64 instead. The first page of a prompt has no previous digest, unless the request carried a
`cache_salt`: then the chain starts from SHA-256(b"sglang-cache-salt-v1\\0" + salt as UTF-8).
The published block hash is the digest's first 8 bytes read big-endian as a signed int64.

The "dynamo" format (`{"format": "dynamo"}`) additionally namespaces every published hash with
SHA-256(tag, extra_key, cache_salt) (`namespace_seed`), as SGLang's `namespaced_block_hash` does.

A consumer matches a prompt by running `page_digests(tokens, block_size, salt)` and looking each
`block_hash(d)` up in what the worker announced: a run of hits from the first page is the
worker's cached prefix, in whole pages.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

_SALT_TAG = b"sglang-cache-salt-v1\0"
_NAMESPACE_TAG = b"sglang-kv-event-namespace-v1"
_U32_MAX = 2**32 - 1


def salt_root(cache_salt: str | None) -> bytes | None:
    """The digest a salted chain starts from (None: no salt, the chain starts bare)."""
    if cache_salt is None:
        return None
    return hashlib.sha256(_SALT_TAG + cache_salt.encode("utf-8")).digest()


def _page_bytes(tokens: Sequence[int]) -> bytes:
    if any(t > _U32_MAX for t in tokens):
        return b"\xff" + array("Q", tokens).tobytes()
    return array("I", tokens).tobytes()


def page_digests(
    tokens: Sequence[int], block_size: int, cache_salt: str | None = None, first: int = 0
) -> list[bytes]:
    """Digests of the whole pages of `tokens` (a trailing partial page has none), each chained to
    the previous one. With `first`, the first `first` digests are computed but not returned."""
    if block_size < 1:
        raise ValueError("block_size must be >= 1")
    if array("I").itemsize != 4 or array("Q").itemsize != 8:
        raise RuntimeError("this platform's array item sizes differ from uint32/uint64")
    prior = salt_root(cache_salt)
    out: list[bytes] = []
    whole = len(tokens) // block_size
    for i in range(whole):
        h = hashlib.sha256()
        if prior is not None:
            h.update(prior)
        h.update(_page_bytes(tokens[i * block_size : (i + 1) * block_size]))
        prior = h.digest()
        if i >= first:
            out.append(prior)
    return out


def block_hash(digest: bytes) -> int:
    """The published int64 of a page digest (SGLang's hash_str_to_int64)."""
    return int.from_bytes(digest[:8], "big", signed=True)


def namespace_seed(extra_key: str | None, cache_salt: str | None) -> bytes | None:
    """The dynamo format's namespace seed (None when neither is set)."""
    if extra_key is None and cache_salt is None:
        return None
    h = hashlib.sha256(_NAMESPACE_TAG)
    for part in (extra_key, cache_salt):
        if part is None:
            h.update(b"\x00")
        else:
            data = part.encode("utf-8")
            h.update(b"\x01" + len(data).to_bytes(8, "little") + data)
    return h.digest()


def namespaced(value: int, seed: bytes | None) -> int:
    """A published hash under a dynamo namespace seed (unchanged without one)."""
    if seed is None:
        return value
    digest = hashlib.sha256(seed + value.to_bytes(8, "big", signed=True)).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def prompt_block_hashes(
    tokens: Sequence[int],
    block_size: int,
    cache_salt: str | None = None,
    extra_key: str | None = None,
    dynamo: bool = False,
) -> list[int]:
    """What a consumer computes for a prompt: the published hash of each of its whole pages."""
    seed = namespace_seed(extra_key, cache_salt) if dynamo else None
    return [namespaced(block_hash(d), seed) for d in page_digests(tokens, block_size, cache_salt)]
