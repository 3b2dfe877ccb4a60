"""`KVTier`: moves pages of K/V between the pool and a store.

- `demote(namespace, tokens, slots, start)`: write every full page of `tokens` that overlaps
  positions `start..` and is not stored yet (read from the pool slots, which must still hold
  that K/V: called just before an evicted node's slots are freed, or right after a publish).
  With a write queue (`write_queue_bytes > 0`, the default) the engine thread only copies the
  pages out of the pool; `PageWriter` (writer.py) encodes and stores them on its own thread,
  and a full queue drops the rest of the prefix (counted) instead of blocking.
- `fetch(namespace, tokens, have)`: the stored pages that continue the resident prefix
  `tokens[:have]`, decoded and verified, as `Fetched` (None when the store has nothing beyond
  `have`). A page that fails verification is deleted and ends the run: nothing unverified is
  served, and the request recomputes from there. A page still queued for writing is served
  from the queue (our own copy of the pool's K/V), never half-read from the store.

Pages are `page_tokens` long and aligned at position 0; a partial last page is never stored.
Keys (runtime/cache/tier/keys.py) carry the model fingerprint and namespace; `set_fingerprint`
after a weights swap makes every older page unreachable.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from runtime.cache.tier import codec
from runtime.cache.tier.keys import Fingerprint, page_keys
from runtime.cache.tier.store import CorruptEntry, KVStore
from runtime.cache.tier.writer import DEFAULT_QUEUE_MB, PageWriter

BACKENDS = ("file", "redis")
WRITE_POLICIES = ("write_back", "write_through")


@dataclass(frozen=True, slots=True)
class TierConfig:
    backend: str = "file"
    #: tokens per stored page (SGLang's HiCache stores pages too; 64 is its common page size)
    page_tokens: int = 64
    #: write_back: pages are written when the pool evicts them; write_through: on every publish
    write_policy: str = "write_back"
    #: load a waiting session's prefix back just before its tool is expected to return
    prefetch: bool = True
    #: seconds before the expected return at which a prefetch runs
    prefetch_lead_s: float = 0.5
    #: bytes of page snapshots the background writer may hold; 0: write on the engine thread
    write_queue_bytes: int = DEFAULT_QUEUE_MB * 2**20
    #: the key of every page's MAC (runtime/cache/tier/codec.py); never printed
    mac_key: bytes = field(default_factory=lambda: os.urandom(32), repr=False)

    def __post_init__(self) -> None:
        problems = []
        if self.backend not in BACKENDS:
            problems.append(f"hicache_storage_backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.page_tokens < 1:
            problems.append("page_tokens must be >= 1")
        if self.write_policy not in WRITE_POLICIES:
            problems.append(
                f"hicache_write_policy must be one of {WRITE_POLICIES}, got {self.write_policy!r}"
            )
        if self.prefetch_lead_s < 0:
            problems.append("prefetch_lead_s must be >= 0")
        if len(self.mac_key) < 16:
            problems.append("the tier's MAC key must be at least 16 bytes")
        if self.write_queue_bytes < 0:
            problems.append("write_queue_bytes must be >= 0")
        if problems:
            raise ValueError("invalid tier config: " + "; ".join(problems))


@dataclass(slots=True)
class TierCounters:
    demoted_pages: int = 0
    demoted_tokens: int = 0
    already_stored_pages: int = 0
    dropped_tokens: int = 0  # evicted without demotion (the policy judged them dead)
    write_failures: int = 0  # synchronous puts the store refused (the writer counts its own)
    dropped_pages: int = 0  # pages not demoted because the write queue was full
    write_time_s: float = 0.0  # engine-thread seconds in demote: the stall an eviction pays
    bytes_written: int = 0  # synchronous writes (the writer counts its own)
    lookups: int = 0
    hits: int = 0  # lookups that loaded at least one page
    loaded_pages: int = 0
    loaded_tokens: int = 0
    bytes_read: int = 0
    queue_served_pages: int = 0  # fetched from the write queue (evicted, not yet written)
    load_time_s: float = 0.0
    corrupt_pages: int = 0
    prefetches: int = 0
    prefetched_tokens: int = 0
    prefetch_retries: int = 0  # prefetches put off: no room in the pool at their due time


@dataclass(slots=True)
class Fetched:
    """Pages continuing a resident prefix: positions `have..end`, one plane list per page
    (each plane [layers, kv_heads, page_tokens, x]); `skip` leading positions of the first page
    are already resident."""

    have: int
    end: int
    pages: list[list[torch.Tensor]] = field(default_factory=list)
    skip: int = 0

    @property
    def tokens(self) -> int:
        return self.end - self.have

    def chunks(self) -> list[tuple[int, list[torch.Tensor]]]:
        """(length, planes) per page, the first trimmed by `skip`: written in order they fill
        positions have..end."""
        out = []
        for i, planes in enumerate(self.pages):
            lo = self.skip if i == 0 else 0
            out.append((planes[0].shape[2] - lo, [p[:, :, lo:] for p in planes]))
        return out


class KVTier:
    def __init__(self, store: KVStore, config: TierConfig, pool, fingerprint: Fingerprint) -> None:
        self.store, self.config, self.pool = store, config, pool
        self.fingerprint = fingerprint
        self.counters = TierCounters()
        self.writer: PageWriter | None = None
        if config.write_queue_bytes > 0:
            self.writer = PageWriter(store, self._encode, config.write_queue_bytes)

    def _encode(self, key: str, planes: Sequence[torch.Tensor]) -> bytes:
        return codec.encode(key, self.pool.fmt.name, planes, self.config.mac_key)

    def set_fingerprint(self, fingerprint: Fingerprint) -> None:
        self.fingerprint = fingerprint

    def keys(self, namespace: str, tokens: Sequence[int]) -> list[str]:
        return page_keys(self.fingerprint, namespace, tokens, self.config.page_tokens)

    # ---- pool -> store --------------------------------------------------------------------
    def demote(self, namespace: str, tokens: Sequence[int], slots: Sequence[int], start: int) -> int:
        """Store (or queue) the full pages overlapping positions start..len(tokens); returns
        pages written or queued."""
        page = self.config.page_tokens
        keys = self.keys(namespace, tokens)
        first = start // page
        if first >= len(keys):
            return 0
        began = time.perf_counter()
        present = self._present(keys[first:])
        todo = [i for i, have in zip(range(first, len(keys)), present, strict=True) if not have]
        self.counters.already_stored_pages += len(keys) - first - len(todo)
        done = 0
        for n, i in enumerate(todo):
            idx = torch.tensor(slots[i * page : (i + 1) * page], device=self.pool.k.device)
            # index_select copies: the snapshot stays valid once the slots are freed and reused
            planes = [torch.index_select(plane, 2, idx).cpu() for plane in self.pool.planes]
            if not self._put(keys[i], planes):
                # a full queue or a full/dead store: the chain breaks here, later pages are useless
                if self.writer is not None:
                    self.counters.dropped_pages += len(todo) - n
                break
            done += 1
        self.counters.demoted_pages += done
        self.counters.demoted_tokens += done * page
        self.counters.write_time_s += time.perf_counter() - began
        return done

    def _put(self, key: str, planes: list[torch.Tensor]) -> bool:
        if self.writer is not None:
            return self.writer.submit(key, planes)
        blob = self._encode(key, planes)
        if not self.store.put(key, blob):
            self.counters.write_failures += 1
            return False
        self.counters.bytes_written += len(blob)
        return True

    def _present(self, keys: Sequence[str]) -> list[bool]:
        """Stored, or queued for writing (served from the queue until written). The queue is
        asked first: a page leaves it only once stored, so it is never missed in between."""
        if self.writer is None:
            return self.store.contains(keys)
        queued = self.writer.pending_of(keys)
        stored = self.store.contains([k for k, q in zip(keys, queued, strict=True) if not q])
        it = iter(stored)
        return [q or next(it) for q in queued]

    def _prefix_hits(self, keys: Sequence[str]) -> int:
        n = 0
        for present in self._present(keys):
            if not present:
                break
            n += 1
        return n

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait for queued writes (tests, benchmarks, shutdown); True when none is left."""
        return True if self.writer is None else self.writer.flush(timeout_s)

    def close(self) -> None:
        """Write what is queued (bounded), then release the store."""
        if self.writer is not None:
            self.writer.close(flush=True)
        self.store.close()

    # ---- store -> pool --------------------------------------------------------------------
    def fetch(self, namespace: str, tokens: Sequence[int], have: int) -> Fetched | None:
        """Verified pages extending `tokens[:have]` toward `len(tokens)` (None: nothing to add)."""
        page = self.config.page_tokens
        self.counters.lookups += 1
        if len(tokens) // page * page <= have:
            return None
        began = time.perf_counter()
        keys = self.keys(namespace, tokens)
        first = have // page
        run = self._prefix_hits(keys[first:])
        got = Fetched(have=have, end=have, skip=have - first * page)
        for i in range(first, first + run):
            queued = None if self.writer is None else self.writer.pending(keys[i])
            if queued is not None:
                got.pages.append(list(queued))
                got.end = (i + 1) * page
                self.counters.queue_served_pages += 1
                continue
            blob = self.store.get(keys[i])
            if blob is None:
                break  # gone since the presence check (another worker, Redis eviction)
            try:
                planes = codec.decode(keys[i], self.pool.fmt.name, blob, self.config.mac_key)
                self._check_shape(planes)
            except CorruptEntry as exc:
                self.counters.corrupt_pages += 1
                self.store.warn("corrupt", "tier entry %s... rejected: %s", keys[i][:16], exc)
                self.store.delete(keys[i])
                break
            got.pages.append(planes)
            got.end = (i + 1) * page
            self.counters.bytes_read += len(blob)
        self.counters.load_time_s += time.perf_counter() - began
        return got if got.pages else None

    def _check_shape(self, planes: list[torch.Tensor]) -> None:
        want = [(p.dtype, p.shape[:2], p.shape[3]) for p in self.pool.planes]
        have = [(p.dtype, p.shape[:2], p.shape[3]) for p in planes]
        if want != have or any(p.shape[2] != self.config.page_tokens for p in planes):
            raise CorruptEntry("page planes do not match the pool's layout")

    def note_loaded(self, fetched: Fetched, seconds: float) -> None:
        """Count a fetch the engine wrote into the pool (`seconds`: the pool writes)."""
        self.counters.hits += 1
        self.counters.loaded_pages += len(fetched.pages)
        self.counters.loaded_tokens += fetched.tokens
        self.counters.load_time_s += seconds

    def stats(self) -> dict[str, object]:
        c = self.counters
        out: dict[str, object] = {f: getattr(c, f) for f in c.__dataclass_fields__}
        out["backend"] = self.store.name
        out["page_tokens"] = self.config.page_tokens
        out["write_policy"] = self.config.write_policy
        out["store"] = {f: getattr(self.store.counters, f) for f in self.store.counters.__dataclass_fields__}
        if self.writer is not None:
            w = self.writer.stats()
            out["writer"] = w
            out["bytes_written"] = c.bytes_written + int(w["written_bytes"])
            out["write_failures"] = c.write_failures + int(w["failed_pages"])
            out["write_queue_bytes"] = w["queue_bytes"]
            out["write_queue_peak_bytes"] = w["peak_queue_bytes"]
        return out
