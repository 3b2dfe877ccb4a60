"""A bounded record of what the radix tree evicted, so a request can be told how many more
prompt tokens it would have matched had nothing been evicted (`meta_info.evicted_prefix_tokens`,
the engine-confirmed `eviction` cause of a trace step's `miss`).

Two hooks feed it: `on_remove(node)` where the tree removes a leaf, and `reach(...)` where a
request's match is made. An evicted leaf is filed under its parent (a node id, or the namespace
for a root: roots come and go with their namespace) by its first token, holding its key and its
own id; the leaf's own evicted children stay filed under that id, so a chain of evictions down
one branch is followed span by span. Nodes are never merged and a split keeps the lower half's
id, so a parent's id still marks the same end position later. Spans are compared token by
token: a reported count is never a hash guess. Oldest spans are dropped past `max_tokens`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Protocol


class _Node(Protocol):
    # read-only members: a protocol's plain attributes are invariant, so TreeNode (whose parent
    # is a TreeNode) would not match
    @property
    def key(self) -> list[int]: ...
    @property
    def parent(self) -> _Node | None: ...
    @property
    def namespace(self) -> str: ...
    @property
    def id(self) -> int: ...


Owner = int | str  # a node id, or a namespace (its root)


def _owner(node: _Node) -> Owner:
    return node.id if node.parent is not None else node.namespace


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class EvictionRecord:
    """Mutated only by the thread that owns the tree (the scheduler's worker)."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max(int(max_tokens), 1)
        self.tokens = 0
        # owner -> first token -> (evicted key, the evicted node's id: its own children's owner)
        self._spans: dict[Owner, dict[int, tuple[list[int], int]]] = {}
        self._order: deque[tuple[Owner, int, list[int]]] = deque()

    def __len__(self) -> int:
        return len(self._order)

    def on_remove(self, node: _Node) -> None:
        """Hook: the tree is removing leaf `node` (its parent link still set)."""
        assert node.parent is not None and node.key
        owner, key = _owner(node.parent), node.key
        self._spans.setdefault(owner, {})[key[0]] = (key, node.id)
        self._order.append((owner, key[0], key))
        self.tokens += len(key)
        while self.tokens > self.max_tokens and self._order:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        owner, first, key = self._order.popleft()
        self.tokens -= len(key)
        spans = self._spans.get(owner)
        if spans is not None and first in spans and spans[first][0] is key:  # not since replaced
            del spans[first]
            if not spans:
                del self._spans[owner]

    def reach(self, node: _Node, key: Sequence[int], matched: int) -> int:
        """Hook: `key[:matched]` was just matched, ending at `node`. Returns how many tokens of
        `key` after `matched` the tree held and evicted (0 when none)."""
        if not self._spans:
            return 0
        best, end, current = matched, matched, node
        while True:  # every node boundary on the path: an evicted span hangs off one of them
            best = max(best, self._follow(_owner(current), key, end))
            if current.parent is None:
                return best - matched
            end -= len(current.key)
            current = current.parent

    def _follow(self, owner: Owner, key: Sequence[int], pos: int) -> int:
        while pos < len(key):
            span = self._spans.get(owner, {}).get(key[pos])
            if span is None:
                return pos
            evicted, owner = span
            n = _common(evicted, key[pos : pos + len(evicted)])
            pos += n
            if n < len(evicted):
                return pos
        return pos

    def clear(self) -> None:
        self._spans.clear()
        self._order.clear()
        self.tokens = 0
