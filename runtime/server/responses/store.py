"""Stored responses: each stored response's context items, per tenant, LRU-bounded.

`previous_response_id` continues from the stored items: the earlier output exactly as generated
(text, call ids and arguments), so the chat path re-renders the earlier turns to the same tokens and
the chain's prefix stays cached. Keys are (tenant, id): another tenant's id is simply absent, exactly
like an unknown one. Bounded by count and by bytes (`--responses-store-max-mb`); the least recently
used goes first.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from runtime.server.turn_records import Replay


@dataclass(frozen=True)
class StoreConfig:
    max_entries: int = 10_000
    max_bytes: int = 256 * 2**20


@dataclass(frozen=True)
class StoredResponse:
    """One stored response: the items before it (`history`, earlier turns of its chain and its own
    input), its JSON body, its own input items (GET .../input_items) and its chain's session name."""

    history: tuple[dict[str, object], ...]
    body: dict[str, Any]
    input_items: tuple[dict[str, Any], ...]
    chain: str
    #: the generated turns of its chain as the chat path remembered them (runtime/server/turn_records.py)
    replays: tuple[Replay, ...] = ()
    size: int = field(init=False)

    def __post_init__(self) -> None:
        parts = (list(self.history), self.body, list(self.input_items))
        held = sum(r.nbytes for r in self.replays)
        object.__setattr__(self, "size", sum(len(json.dumps(p)) for p in parts) + held)

    def restore(self) -> None:
        """Put the chain's generated turns back into the chat path's memos, so that the next
        turn renders them as the tokens generated, however long ago the memos dropped them."""
        for replay in self.replays:
            replay.run()

    def context(self) -> list[dict[str, Any]]:
        """What a response continuing this one starts from: history, then this output."""
        return [*self.history, *self.body["output"]]


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
