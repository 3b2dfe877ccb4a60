"""`KVTier`: moves pages of K/V between the pool and a store.

- `demote(namespace, tokens, slots, start)`: write every full page of `tokens` that overlaps
  positions `start..` and is not stored yet (read from the pool slots, which must still hold
  that K/V: called just before an evicted node's slots are freed, or right after a publish).
- `fetch(namespace, tokens, have)`: the stored pages that continue the resident prefix
  `tokens[:have]`, decoded and verified, as `Fetched` (None when the store has nothing beyond
  `have`). A page that fails verification is deleted and ends the run: nothing unverified is
  served, and the request recomputes from there.

Pages are `page_tokens` long and aligned at position 0; a partial last page is never stored.
Keys (runtime/cache/tier/keys.py) carry the model fingerprint and namespace; `set_fingerprint`
after a weights swap makes every older page unreachable.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from runtime.cache.tier import codec
from runtime.cache.tier.keys import Fingerprint, page_keys
from runtime.cache.tier.store import CorruptEntry, KVStore

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
        if problems:
            raise ValueError("invalid tier config: " + "; ".join(problems))


@dataclass(slots=True)
class TierCounters:
    demoted_pages: int = 0
    demoted_tokens: int = 0
    already_stored_pages: int = 0
    dropped_tokens: int = 0  # evicted without demotion (the policy judged them dead)
    write_failures: int = 0
    write_time_s: float = 0.0
    bytes_written: int = 0
    lookups: int = 0
    hits: int = 0  # lookups that loaded at least one page
    loaded_pages: int = 0
    loaded_tokens: int = 0
    bytes_read: int = 0
    load_time_s: float = 0.0
    corrupt_pages: int = 0
    prefetches: int = 0
    prefetched_tokens: int = 0


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

    def set_fingerprint(self, fingerprint: Fingerprint) -> None:
        self.fingerprint = fingerprint

    def keys(self, namespace: str, tokens: Sequence[int]) -> list[str]:
        return page_keys(self.fingerprint, namespace, tokens, self.config.page_tokens)

    # ---- pool -> store --------------------------------------------------------------------
    def demote(self, namespace: str, tokens: Sequence[int], slots: Sequence[int], start: int) -> int:
        """Write the full pages overlapping positions start..len(tokens); returns pages written."""
        page = self.config.page_tokens
        keys = self.keys(namespace, tokens)
        first = start // page
        if first >= len(keys):
            return 0
        began = time.perf_counter()
        present = self.store.contains(keys[first:])
        todo = [i for i, have in zip(range(first, len(keys)), present, strict=True) if not have]
        self.counters.already_stored_pages += len(keys) - first - len(todo)
        written = 0
        for i in todo:
            idx = torch.tensor(slots[i * page : (i + 1) * page], device=self.pool.k.device)
            planes = [torch.index_select(plane, 2, idx).cpu() for plane in self.pool.planes]
            blob = codec.encode(keys[i], self.pool.fmt.name, planes)
            if not self.store.put(keys[i], blob):
                self.counters.write_failures += 1
                break  # a full or dead store: do not pay for the rest of the pages
            written += 1
            self.counters.bytes_written += len(blob)
        self.counters.demoted_pages += written
        self.counters.demoted_tokens += written * page
        self.counters.write_time_s += time.perf_counter() - began
        return written

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
        run = self.store.prefix_hits(keys[first:])
        got = Fetched(have=have, end=have, skip=have - first * page)
        for i in range(first, first + run):
            blob = self.store.get(keys[i])
            if blob is None:
                break  # gone since the presence check (another worker, Redis eviction)
            try:
                planes = codec.decode(keys[i], self.pool.fmt.name, blob)
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
        return out
