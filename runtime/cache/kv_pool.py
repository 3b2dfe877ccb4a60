"""A fixed budget of KV slots. The allocator is pure Python (the eviction simulator uses it
without tensors); `KVPool` adds the preallocated K/V storage the model reads and writes."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from runtime.cache.kv_format import KVFormat
from runtime.errors import PoolExhausted
from runtime.model.attention import BLOCK


class SlotAllocator:
    """Hands out slot indices 0..size-1; never more than `size` are out at once.

    Slots come back sorted, and `alloc(n, after=s)` takes s+1..s+n when they are all free: a
    request's positions then tend to be one run of slots, which attention reads as a view of
    the pool instead of gathering (runtime/model/model.py: `_Views`). Free slots sit on a stack; one
    taken by `after` stays there, stale, and is skipped when popped."""

    def __init__(self, size: int) -> None:
        if size <= 0:
            raise ValueError("pool size must be positive")
        self.size = size
        self.reset()

    @property
    def available(self) -> int:
        return self._available

    @property
    def used(self) -> int:
        return self.size - self._available

    def alloc(self, n: int, after: int | None = None) -> list[int]:
        if n > self._available:
            raise PoolExhausted(f"need {n} KV slots, {self._available} free of {self.size}")
        if n == 0:
            return []
        if (
            after is not None
            and after + n < self.size
            and self._is_free[after + 1 : after + 1 + n] == b"\x01" * n
        ):
            return self.take_run(after + 1, n)
        out: list[int] = []
        stack, is_free, in_stack = self._free, self._is_free, self._in_stack
        while len(out) < n:
            s = stack.pop()
            in_stack[s] = 0
            if is_free[s]:
                is_free[s] = 0
                out.append(s)
        self._available -= n
        out.sort()
        return out

    def free_run(self, n: int, after: int | None = None) -> int | None:
        """The first slot of n consecutive free slots: right after `after` when those are free,
        else the lowest such run; None when the free slots hold no run that long."""
        if n <= 0 or n > self._available:
            return None
        if (
            after is not None
            and after + n < self.size
            and self._is_free[after + 1 : after + 1 + n] == b"\x01" * n
        ):
            return after + 1
        at = self._is_free.find(b"\x01" * n)
        return None if at < 0 else at

    def take_run(self, first: int, n: int) -> list[int]:
        """Slots first..first+n-1, all free (from `free_run`); their stack entries go stale."""
        assert self._is_free[first : first + n] == b"\x01" * n, "take_run over slots in use"
        self._is_free[first : first + n] = bytes(n)
        self._available -= n
        return list(range(first, first + n))

    def free(self, slots: Sequence[int]) -> None:
        is_free, in_stack, stack = self._is_free, self._in_stack, self._free
        for s in slots:
            if is_free[s]:
                raise AssertionError(f"slot {s} freed twice")
            is_free[s] = 1
            if not in_stack[s]:
                in_stack[s] = 1
                stack.append(s)
        self._available += len(slots)

    def free_slots(self) -> list[int]:
        """The free slots (integrity checks)."""
        return [s for s in self._free if self._is_free[s]]

    def reset(self) -> None:
        # Popping from the end hands out low indices first, which keeps early slots hot.
        self._free: list[int] = list(range(self.size - 1, -1, -1))
        self._is_free = bytearray(b"\x01") * self.size
        self._in_stack = bytearray(b"\x01") * self.size
        self._available = self.size


class KVPool(SlotAllocator):
    """Preallocated K and V: k: [layers, kv_heads, size, head_dim], the layout of a request's
    SeqKV, so a cached prefix moves in or out with one index_select / index_copy_ over the slot
    dimension and no temporaries (advanced indexing measured ~6x slower for a 2k-token prefix).
    Per head, positions are contiguous rows: CPU attention reads them ~2x faster than any
    token-major layout once the KV outgrows the caches (measured at 2k tokens).

    `fmt` (runtime/cache/kv_format.py) sets what a slot holds: K/V in a float dtype, or int8
    levels plus a scale per (token, head) in two more planes of the same layout."""

    def __init__(
        self,
        size: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype | KVFormat,
        device: str,
    ) -> None:
        super().__init__(size)
        self.fmt = dtype if isinstance(dtype, KVFormat) else KVFormat.plain(dtype)
        # BLOCK rows past the last slot, never handed out: deterministic attention reads a
        # request's rows to the end of its last block (runtime/model/attention.py), and they are zeros
        self.planes = self.fmt.alloc(num_layers, num_kv_heads, size + BLOCK, head_dim, device, zeros=True)
        self.k, self.v = self.planes[0], self.planes[1]

    def write(self, slots: Sequence[int], *src: torch.Tensor) -> None:
        """Stores K/V given as planes [layers, kv_heads, len(slots), x] (every plane of a SeqKV span:
        k, v, and the scales where the format has them) into the slots."""
        idx = torch.tensor(slots, device=self.k.device)
        for plane, values in zip(self.planes, _flat(src), strict=True):
            plane.index_copy_(2, idx, values)

    @staticmethod
    def bytes_per_token(
        num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype | KVFormat
    ) -> int:
        fmt = dtype if isinstance(dtype, KVFormat) else KVFormat.plain(dtype)
        return fmt.bytes_per_token(num_layers, num_kv_heads, head_dim)

    @property
    def capacity_bytes(self) -> int:
        return sum(p[:, :, : self.size].numel() * p.element_size() for p in self.planes)


def _flat(parts: tuple) -> list[torch.Tensor]:
    """read(slots, k, v) and read(slots, kv.span(a, b)) both work."""
    return [t for p in parts for t in (p if isinstance(p, (tuple, list)) else (p,))]
