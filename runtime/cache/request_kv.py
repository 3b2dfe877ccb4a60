"""Running requests' K/V: positions in the shared pool, read by attention where they lie.

A request's `SeqKV` is a view of the pool's planes through the lease's slot list, so a cached
prefix is never copied and the KV held is the pool's bytes, whatever runs: the budget that
`--max-total-tokens` sets holds. Attention reads one run of slots as a view and gathers
scattered ones per layer into a transient scratch (runtime/model/model.py: `_Views`).
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.cache.kv_pool import KVPool
from runtime.cache.seq_kv import SeqKV


class PooledKV:
    """`RequestKV` for the engine: every request's K/V lives in `pool`."""

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool

    def take(self, slots: list[int], cached: int) -> SeqKV:
        """A view of the pool through `slots` (the lease's own list: it grows and is rebound in
        place); its first `cached` positions hold the matched prefix already."""
        planes = self.pool.planes
        return SeqKV(planes[0], planes[1], slots, cached, self.pool.fmt, planes[2:])

    def copy(self, src: Sequence[int], dst: Sequence[int]) -> None:
        """Every layer's K/V at slots `src` into `dst` (one run), run by run as slice copies
        (bytes unchanged: attention on the copy equals attention on the original)."""
        at = dst[0]
        for first, n in _runs(src):
            for plane in self.pool.planes:
                plane[:, :, at : at + n].copy_(plane[:, :, first : first + n])
            at += n

    @property
    def held_bytes(self) -> int:
        """The pool's bytes: a request's K/V is a view of its slots, never a copy of its own."""
        return self.pool.capacity_bytes


def _runs(slots: Sequence[int]) -> list[tuple[int, int]]:
    """(first slot, length) of each run of consecutive slots, in order."""
    out: list[tuple[int, int]] = []
    for s in slots:
        if out and out[-1][0] + out[-1][1] == s:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((s, 1))
    return out
