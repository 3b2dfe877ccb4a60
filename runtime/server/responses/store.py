"""Stored responses: each stored response's exact token history, per tenant, LRU-bounded.

`previous_response_id` continues from these token ids (never re-rendered text), so a chain cannot
drift. Keys are (tenant, id): another tenant's id is simply absent, exactly like an unknown one.
Bounded by count and by bytes (`--responses-store-max-mb`, not wired yet); oldest use goes first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

#: bytes one stored token id is counted as (an int in an array of int32)
_TOKEN_BYTES = 4


@dataclass(frozen=True)
class StoreConfig:
    max_entries: int = 10_000
    max_bytes: int = 256 * 2**20


@dataclass(frozen=True)
class StoredResponse:
    """One stored response: its full token history (prompt + output) and its JSON body."""

    tokens: tuple[int, ...]
    body: dict[str, Any]
    input_items: tuple[dict[str, Any], ...]

    @property
    def size(self) -> int:
        return len(self.tokens) * _TOKEN_BYTES + len(repr(self.body)) + len(repr(self.input_items))


class ResponseStore:
    """LRU map (tenant, response id) -> StoredResponse, bounded in count and bytes."""

    def __init__(self, config: StoreConfig) -> None:
        self._config = config
        self._items: OrderedDict[tuple[str, str], StoredResponse] = OrderedDict()
        self._bytes = 0

    def put(self, tenant: str, rid: str, item: StoredResponse) -> bool:
        """Store `item`; False when it alone exceeds the byte bound (then nothing is stored)."""
        if item.size > self._config.max_bytes:
            return False
        self.delete(tenant, rid)
        self._items[(tenant, rid)] = item
        self._bytes += item.size
        self._evict()
        return True

    def get(self, tenant: str, rid: str) -> StoredResponse | None:
        item = self._items.get((tenant, rid))
        if item is not None:
            self._items.move_to_end((tenant, rid))
        return item

    def delete(self, tenant: str, rid: str) -> bool:
        item = self._items.pop((tenant, rid), None)
        if item is None:
            return False
        self._bytes -= item.size
        return True

    def _evict(self) -> None:
        while len(self._items) > self._config.max_entries or self._bytes > self._config.max_bytes:
            _, old = self._items.popitem(last=False)
            self._bytes -= old.size

    def __len__(self) -> int:
        return len(self._items)

    @property
    def bytes_used(self) -> int:
        return self._bytes
