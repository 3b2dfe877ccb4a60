"""Running requests' own K/V buffers (`SeqKV`), filled from and published into the pool.

Attention reads one contiguous buffer per request; a cached prefix is copied into it from the
pool's slots at start, and the positions the tree adopts are written back at publish.
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.cache.kv_pool import KVPool
from runtime.model import ModelConfig, SeqKV, SpareBuffers


class BufferedKV:
    """`RequestKV` for the engine: pool + one `SeqKV` per running request + parked buffers."""

    def __init__(self, pool: KVPool, cfg: ModelConfig, device: str) -> None:
        self.pool = pool
        # parked request buffers: at most half the pool's own size, and 1 GiB
        self.spare = SpareBuffers(cfg, pool.fmt, device, min(pool.capacity_bytes // 2, 2**30))

    def take(self, slots: Sequence[int], capacity: int) -> SeqKV:
        kv = self.spare.take(capacity)
        if slots:
            self.pool.read(slots, kv.span(0, len(slots)))
            kv.length = len(slots)
        return kv

    def adopt(self, buffer: object, slots: Sequence[int], start: int, stop: int) -> None:
        assert isinstance(buffer, SeqKV)
        self.pool.write(slots[start:stop], buffer.span(start, stop))

    def give(self, buffer: object) -> None:
        assert isinstance(buffer, SeqKV)
        self.spare.give(buffer)

    def held_bytes(self, buffers: Sequence[object]) -> int:
        """Pool + running requests' buffers + parked ones."""
        running = sum(b.nbytes for b in buffers if isinstance(b, SeqKV))
        return self.pool.capacity_bytes + running + self.spare.nbytes

    @property
    def budget_bytes(self) -> int:
        return self.pool.capacity_bytes * 3  # today's design bound (pool + requests + parked)
