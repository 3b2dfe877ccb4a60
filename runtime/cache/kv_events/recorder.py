"""What the radix tree tells the KV-event publisher, recorded on the engine's thread at the cost
of a list copy and a queue put; hashing and encoding happen on the publisher's thread.

Pages over a token-level tree: the tree keeps single tokens (page size 1) and events speak of
pages of `block_size` tokens. Page i of a path is tokens [i*B, (i+1)*B). It is *stored* the
moment the tree holds all of its tokens (an insert that extends the path past the page's end)
and *removed* the moment any of its tokens leaves (the eviction of the leaf holding its last
token; a leaf is only evicted after its descendants, so the leaf's earlier tokens on that page
go no earlier). A node covering path positions [start, end) therefore announces, on insert and
on eviction alike, exactly the pages whose end lies in (start, end]. A trailing partial page is
never announced: a consumer matches whole pages, as it would against SGLang at that page size.

Mutations: `name` (any thread: which salt a namespace digest stands for), the queue, `dropped`.
"""

from __future__ import annotations

import queue
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

#: namespaces remembered before the ones the tree no longer holds are forgotten
_MAX_NAMES = 4096


class _Node(Protocol):
    @property
    def key(self) -> list[int]: ...
    @property
    def parent(self) -> _Node | None: ...
    @property
    def namespace(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Change:
    """One tree change for the publisher: `kind` store / remove / clear; `tokens` is the path
    from the namespace's root to the end of the last page concerned; pages from `first_page` on
    are the ones announced."""

    kind: str
    tokens: tuple[int, ...] = ()
    first_page: int = 0
    cache_salt: str | None = None
    extra_key: str | None = None
    session_id: str | None = None


class KVEventRecorder:
    """The tree's observer (`RadixCache.observer`): `on_insert`, `on_remove`, `on_reset`."""

    def __init__(self, block_size: int, max_queue: int, roots: dict[str, object]) -> None:
        if block_size < 1:
            raise ValueError("block_size (--page-size) must be >= 1")
        self.block_size = block_size
        self.changes: queue.Queue[Change] = queue.Queue(maxsize=max_queue)
        self.dropped = 0  # changes lost to a full queue (the consumer's view diverged)
        self.recorded = 0
        self._names: dict[str, tuple[str | None, str | None]] = {}
        self._roots = roots  # the tree's namespace -> root map (read on the engine thread only)

    def name(self, namespace: str, cache_salt: str | None, extra_key: str | None) -> None:
        """Remember which (salt, extra_key) a namespace digest stands for (the request path)."""
        if namespace:  # re-added at the end: the newest names are never the ones forgotten
            self._names.pop(namespace, None)
            self._names[namespace] = (cache_salt or None, extra_key or None)

    # ---- hooks (engine thread) --------------------------------------------------------------
    def on_insert(self, key: Sequence[int], start: int, namespace: str, session_id: str | None) -> None:
        """The tree added `key[start:]` after its already-held `key[:start]`."""
        first, last = start // self.block_size, len(key) // self.block_size
        if last > first:
            self._put("store", key[: last * self.block_size], first, namespace, session_id)

    def on_remove(self, node: _Node) -> None:
        """The tree is about to remove leaf `node` (still linked to its parent)."""
        parts, depth, cur = [], 0, node
        while cur.parent is not None:
            parts.append(cur.key)
            depth += len(cur.key)
            cur = cur.parent
        start = depth - len(node.key)
        first, last = start // self.block_size, depth // self.block_size
        if last <= first:
            return
        path = [t for part in reversed(parts) for t in part]
        self._put("remove", path[: last * self.block_size], first, node.namespace, None)

    def on_reset(self) -> None:
        self._offer(Change("clear"))

    # ---- internals ----------------------------------------------------------------------
    def _put(
        self, kind: str, tokens: Sequence[int], first: int, namespace: str, session_id: str | None
    ) -> None:
        salt, extra = self._names.get(namespace, (None, None)) if namespace else (None, None)
        if namespace and namespace not in self._names:
            self.dropped += 1  # a namespace nobody named: its hashes cannot be computed
            return
        if session_id is not None and namespace and session_id.startswith(namespace + "/"):
            session_id = session_id[len(namespace) + 1 :]  # the client's id, not the scoped key
        self._offer(Change(kind, tuple(tokens), first, salt, extra, session_id))
        if len(self._names) > _MAX_NAMES:
            self._forget_unused()

    def _offer(self, change: Change) -> None:
        try:
            self.changes.put_nowait(change)
            self.recorded += 1
        except queue.Full:
            self.dropped += 1

    def _forget_unused(self) -> None:
        """Drop the older half's namespaces the tree no longer holds (newer ones may be about to
        insert their first path)."""
        names = list(self._names)
        for ns in names[: len(names) // 2]:
            if ns not in self._roots:
                del self._names[ns]
