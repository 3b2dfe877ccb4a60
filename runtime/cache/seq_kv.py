"""`SeqKV`: one request's K/V positions as rows of the engine's KV pool.

The cache owns this view (request_kv.py binds it to the pool's rows); the model's forward pass reads
and writes through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from runtime.cache.kv_format import KVFormat
from runtime.model.attention import padded_length

if TYPE_CHECKING:
    from runtime.model.config import ModelConfig


@dataclass(slots=True, eq=False)
class SeqKV:
    """One request's K/V positions in planes laid out like the pool: k: [layers, kv_heads, rows,
    head_dim]; the first `length` positions are filled. `fmt` says how they are stored (None:
    plainly in k's dtype); int8 adds `scales` (K's and V's, [layers, kv_heads, rows, 1] each).

    The planes are a KV pool and position i lives in row `slots[i]` (for the engine, the cache
    manager's list for the request, grown and rebound in place): attention reads the pool itself,
    one run of rows as a view, scattered rows through a per-layer gather (see `_Views`), so no
    request copies cached KV."""

    k: torch.Tensor
    v: torch.Tensor
    slots: list[int]
    length: int = 0
    fmt: KVFormat | None = None
    scales: tuple[torch.Tensor, ...] = ()

    @classmethod
    def empty(cls, cfg: ModelConfig, capacity: int, fmt: KVFormat | torch.dtype, device: str) -> SeqKV:
        """A pool of its own for one sequence (tests, benchmarks): position i in row i."""
        fmt = fmt if isinstance(fmt, KVFormat) else KVFormat.plain(fmt)
        # zero-filled and whole attention blocks: deterministic attention reads to a block's end
        rows = padded_length(capacity)
        planes = fmt.alloc(cfg.layers, cfg.kv_heads, rows, cfg.head_dim, device, zeros=True)
        return cls(planes[0], planes[1], list(range(capacity)), fmt=fmt, scales=planes[2:])

    @property
    def format(self) -> KVFormat:
        return self.fmt or KVFormat.plain(self.k.dtype)

    @property
    def planes(self) -> tuple[torch.Tensor, ...]:
        return (self.k, self.v, *self.scales)

    def span(self, start: int, stop: int) -> tuple[torch.Tensor, ...]:
        """Positions start..stop-1 of every plane (what moves in or out of the pool)."""
        return tuple(p[:, :, start:stop] for p in self.planes)

    @property
    def capacity(self) -> int:
        return len(self.slots)

    def rows(self, start: int, stop: int) -> int | torch.Tensor:
        """Where positions start..stop-1 live: the first row when they are one run (views
        work), else a tensor of rows (gather / index_copy)."""
        part = self.slots[start:stop]
        first = part[0] if part else 0
        if part == list(range(first, first + len(part))):
            return first
        return torch.tensor(part, device=self.k.device)

    def layer(self, li: int, upto: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer li's first `upto` positions as [1, kv_heads, upto, head_dim] (views of one run,
        else gathered copies)."""
        at = self.rows(0, upto)
        if isinstance(at, int):
            return self.k[li, :, at : at + upto].unsqueeze(0), self.v[li, :, at : at + upto].unsqueeze(0)
        return self.k[li].index_select(1, at).unsqueeze(0), self.v[li].index_select(1, at).unsqueeze(0)

    def write(self, li: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Stores layer li's K/V ([kv_heads, n, head_dim]) at positions start..start+n-1 (plain formats)."""
        n = k.shape[1]
        at = self.rows(start, start + n)
        if isinstance(at, int):
            self.k[li, :, at : at + n] = k
            self.v[li, :, at : at + n] = v
        else:
            self.k[li].index_copy_(1, at, k.to(self.k.dtype))
            self.v[li].index_copy_(1, at, v.to(self.v.dtype))
