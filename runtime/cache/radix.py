"""Token-level radix tree (page size 1) whose nodes hold KV pool slots.

Mutations: `match_prefix` splits a node on a partial match and bumps access/hit counters;
`insert` adds new nodes; `evict` frees unlocked leaves into the allocator; `lock`/`unlock`
change lock refs along a path. A slot list returned by `match_prefix` stays valid only while
its node is locked: anything unlocked may be evicted by the next allocation.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from runtime.cache.evictions import EvictionRecord
from runtime.cache.kv_pool import SlotAllocator

_ids = itertools.count()


@dataclass(slots=True, eq=False)
class TreeNode:
    """Field names follow SGLang's TreeNode so one eviction policy serves both trees."""

    key: list[int]
    value: list[int]
    parent: TreeNode | None
    namespace: str
    children: dict[int, TreeNode] = field(default_factory=dict)
    lock_ref: int = 0
    last_access_time: float = 0.0
    creation_time: float = 0.0
    hit_count: int = 0
    priority: int = 0
    #: session ids whose contexts run through this node (session-aware eviction reads it)
    sessions: set[str] = field(default_factory=set)
    id: int = field(default_factory=lambda: next(_ids))

    @property
    def is_leaf(self) -> bool:
        return not self.children

    def __lt__(self, other: TreeNode) -> bool:  # heap tie-breaks
        return self.id < other.id


class TreeObserver(Protocol):
    """Told of every change to what the tree holds (the KV-event recorder,
    runtime/cache/kv_events/recorder.py); runs on the tree owner's thread and must be cheap."""

    def on_insert(self, key: Sequence[int], start: int, namespace: str, session_id: str | None) -> None: ...
    def on_remove(self, node: TreeNode) -> None: ...
    def on_reset(self) -> None: ...


class EvictionPolicy(Protocol):
    """SGLang's shape: lower priority is evicted first."""

    def get_priority(self, node: TreeNode) -> object: ...


@dataclass(frozen=True, slots=True)
class MatchResult:
    slots: list[int]
    node: TreeNode  # deepest matched node: lock it to keep `slots` alive

    @property
    def length(self) -> int:
        return len(self.slots)


class InsertResult(NamedTuple):
    present: int  # leading tokens the tree already held: the caller frees its slots for those
    node: TreeNode  # the node the inserted key ends at: lock it to keep `slots` alive
    slots: list[int]  # the tree's slot per position of the key (its own copy where present)


@dataclass(slots=True)
class CacheCounters:
    inserts: int = 0
    evictions: int = 0
    evicted_tokens: int = 0
    matches: int = 0
    match_time_s: float = 0.0


def _common_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # C-speed fast path for the common full match
        return n
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class RadixCache:
    def __init__(self, allocator: SlotAllocator, policy: EvictionPolicy, clock=time.monotonic) -> None:
        self.allocator = allocator
        self.policy = policy
        self.clock = clock
        self.counters = CacheCounters()
        self.roots: dict[str, TreeNode] = {}
        self.evictable_size = 0  # tokens in unlocked nodes
        self.protected_size = 0  # tokens in locked nodes
        self._leaves_set: set[TreeNode] = set()  # non-root leaves, kept so eviction never walks the tree
        #: called with each leaf about to be evicted while its slots and its ancestors' still hold
        #: K/V: the KV tier demotes it instead of dropping it (runtime/cache/tier/hooks.py)
        self.on_evict: Callable[[TreeNode], None] | None = None
        #: told of inserts, removals and resets (KV events); None: nobody listens
        self.observer: TreeObserver | None = None
        # misses (issue 19): what was evicted, to report per request what it would have matched
        self.evictions: EvictionRecord | None = EvictionRecord(4 * allocator.size)

    # ---- lookup -------------------------------------------------------------------------
    def root(self, namespace: str) -> TreeNode:
        node = self.roots.get(namespace)
        if node is None:
            node = TreeNode(key=[], value=[], parent=None, namespace=namespace, lock_ref=1)
            self.roots[namespace] = node
        return node

    def _root_or_empty(self, namespace: str) -> TreeNode:
        """The namespace's root, or a detached empty one: lookups never create roots (a root per
        probed salt would outlive every bound), only `insert` does."""
        return self.roots.get(namespace) or TreeNode(
            key=[], value=[], parent=None, namespace=namespace, lock_ref=1
        )

    def _walk(self, key: Sequence[int], namespace: str, split: bool = True) -> Iterator[tuple[TreeNode, int]]:
        """The nodes `key` runs through from its namespace's root, each with how many of its
        tokens `key` covers. With `split`, a partial match is cut so the last node ends there;
        without, the walk yields that partial edge last and changes nothing."""
        node, pos = self.roots.get(namespace), 0
        while node is not None and pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                return
            n = _common_len(child.key, key[pos : pos + len(child.key)])
            if n < len(child.key):
                if not split:
                    yield child, n
                    return
                child = self._split(child, n)
            yield child, n
            node, pos = child, pos + n

    def match_prefix(
        self, key: Sequence[int], namespace: str = "", session_id: str | None = None
    ) -> MatchResult:
        """Longest cached prefix of `key`; splits the last node at a partial match."""
        start = time.perf_counter()
        now = self.clock()
        node, slots = self._root_or_empty(namespace), []
        for node, _ in self._walk(key, namespace):  # noqa: B007 — the last node is the match
            node.last_access_time = now
            node.hit_count += 1
            if session_id is not None:
                node.sessions.add(session_id)
            slots.extend(node.value)
        self.counters.matches += 1
        self.counters.match_time_s += time.perf_counter() - start
        return MatchResult(slots, node)

    def find_node(self, key: Sequence[int], namespace: str = "") -> MatchResult:
        """Like `match_prefix` but leaves access times and hit counts alone (engine bookkeeping)."""
        node, slots = self._root_or_empty(namespace), []
        for node, _ in self._walk(key, namespace):  # noqa: B007 — the last node is the match
            slots.extend(node.value)
        return MatchResult(slots, node)

    def cached_length(self, key: Sequence[int], namespace: str = "") -> int:
        """How many leading tokens of `key` the tree holds; changes nothing (scheduling peeks)."""
        return sum(n for _, n in self._walk(key, namespace, split=False))

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut `child` after n tokens; returns the new upper node."""
        upper = TreeNode(
            key=child.key[:n],
            value=child.value[:n],
            parent=child.parent,
            namespace=child.namespace,
            lock_ref=child.lock_ref,
            last_access_time=child.last_access_time,
            creation_time=child.creation_time,
            hit_count=child.hit_count,
            priority=child.priority,
            sessions=set(child.sessions),
        )
        upper.children[child.key[n]] = child
        assert child.parent is not None
        child.parent.children[child.key[0]] = upper
        child.parent, child.key, child.value = upper, child.key[n:], child.value[n:]
        return upper

    # ---- insertion ----------------------------------------------------------------------
    def insert(
        self,
        key: Sequence[int],
        slots: Sequence[int],
        namespace: str = "",
        priority: int = 0,
        session_id: str | None = None,
    ) -> InsertResult:
        """Add key→slots; says how many leading tokens the tree already held, and where the key
        ends, in one walk. The caller frees `slots[cached:present]` (computed twice); the tree
        adopts `slots[present:]`."""
        assert len(key) == len(slots)
        now = self.clock()
        node, pos, path = self.root(namespace), 0, []
        for child, n in self._walk(key, namespace):
            self._touch(child, now, priority, session_id)
            node, pos = child, pos + n
            path.extend(child.value)
        present = pos
        if pos < len(key):
            node = self._add_leaf(node, key[pos:], slots[pos:], now, priority, session_id)
            path.extend(node.value)
            if self.observer is not None:
                self.observer.on_insert(key, pos, namespace, session_id)
        return InsertResult(present, node, path)

    def _add_leaf(
        self,
        parent: TreeNode,
        key: Sequence[int],
        slots: Sequence[int],
        now: float,
        priority: int,
        session_id: str | None,
    ) -> TreeNode:
        leaf = TreeNode(
            key=list(key),
            value=list(slots),
            parent=parent,
            namespace=parent.namespace,
            last_access_time=now,
            creation_time=now,
            priority=priority,
        )
        if session_id is not None:
            leaf.sessions.add(session_id)
        parent.children[key[0]] = leaf
        self._leaves_set.discard(parent)
        self._leaves_set.add(leaf)
        self.evictable_size += len(leaf.key)
        self.counters.inserts += 1
        return leaf

    @staticmethod
    def _touch(node: TreeNode, now: float, priority: int, session_id: str | None) -> None:
        node.last_access_time = now
        node.priority = max(node.priority, priority)  # SGLang propagates the max along the path
        if session_id is not None:
            node.sessions.add(session_id)

    # ---- locking ------------------------------------------------------------------------
    def lock(self, node: TreeNode) -> None:
        while node.parent is not None:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: TreeNode) -> None:
        while node.parent is not None:
            if node.lock_ref <= 0:
                raise AssertionError(f"unlock of unlocked node {node.id}")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable_size += len(node.key)
                self.protected_size -= len(node.key)
            node = node.parent

    # ---- eviction -----------------------------------------------------------------------
    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` slots from unlocked leaves, lowest priority first."""
        get_priority = self.policy.get_priority
        heap = [(get_priority(n), n) for n in self._leaves_set if n.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, node = heapq.heappop(heap)
            freed += self._remove_leaf(node)
            parent = node.parent
            if parent is not None and parent.parent is not None and parent.is_leaf and parent.lock_ref == 0:
                heapq.heappush(heap, (self.policy.get_priority(parent), parent))
        return freed

    def _remove_leaf(self, node: TreeNode) -> int:
        assert node.parent is not None and node.is_leaf and node.lock_ref == 0
        if self.evictions is not None:  # misses (issue 19)
            self.evictions.on_remove(node)
        if self.on_evict is not None:
            self.on_evict(node)
        if self.observer is not None:
            self.observer.on_remove(node)
        self.allocator.free(node.value)
        parent = node.parent
        del parent.children[node.key[0]]
        self._leaves_set.discard(node)
        if parent.parent is not None and not parent.children:
            self._leaves_set.add(parent)
        elif parent.parent is None and not parent.children and self.roots.get(parent.namespace) is parent:
            del self.roots[parent.namespace]  # an empty namespace keeps nothing
        self.evictable_size -= len(node.key)
        self.counters.evictions += 1
        self.counters.evicted_tokens += len(node.key)
        return len(node.key)

    def attached(self, node: TreeNode) -> bool:
        """Whether `node` is still in the tree: neither evicted nor reset away (a split keeps the
        object as the lower part, so it stays attached with the slots it had)."""
        while node.parent is not None:
            if node.parent.children.get(node.key[0]) is not node:
                return False
            node = node.parent
        return self.roots.get(node.namespace) is node

    def path_nodes(
        self, key: Sequence[int], namespace: str = "", split_at: int | None = None
    ) -> list[tuple[TreeNode, int]]:
        """(node, start offset) along the cached part of `key`, without touching access stats.

        With `split_at`, a node straddling that offset is split there first, so that every node
        returned lies wholly before or wholly after it (session rollbacks mark the part after).
        """
        node, pos, out = self.roots.get(namespace), 0, []
        while node is not None and pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                break
            n = _common_len(child.key, key[pos : pos + len(child.key)])
            if split_at is not None and pos < split_at < pos + n:
                child, n = self._split(child, split_at - pos), split_at - pos
            elif n < len(child.key):
                out.append((child, pos))
                break
            out.append((child, pos))
            node, pos = child, pos + n
        return out

    def nodes(self) -> list[TreeNode]:
        out, stack = [], [c for r in self.roots.values() for c in r.children.values()]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    # ---- maintenance --------------------------------------------------------------------
    def reset(self) -> None:
        """Drop every node and return all their slots. Only safe with nothing locked."""
        if self.protected_size:
            raise RuntimeError("cannot reset the cache while requests hold locks")
        for node in self.nodes():
            self.allocator.free(node.value)
        self.roots.clear()
        self._leaves_set.clear()
        self.evictable_size = 0
        if self.observer is not None:
            self.observer.on_reset()

    @property
    def total_size(self) -> int:
        return self.evictable_size + self.protected_size

    def check_integrity(self, in_flight_slots: Sequence[int] = ()) -> None:
        """Every slot is exactly one of: free, held by a node, held by an in-flight request."""
        held: list[int] = []
        evictable = protected = 0
        for node in self.nodes():
            assert len(node.key) == len(node.value) > 0, f"node {node.id} key/value mismatch"
            assert node.lock_ref >= 0, f"node {node.id} negative lock_ref"
            assert node.parent is not None and node.parent.children.get(node.key[0]) is node
            for child in node.children.values():
                assert child.lock_ref <= node.lock_ref, f"child {child.id} locked more than parent"
            held.extend(node.value)
            if node.lock_ref:
                protected += len(node.key)
            else:
                evictable += len(node.key)
        assert (evictable, protected) == (self.evictable_size, self.protected_size), "size accounting drift"
        leaves = {n for n in self.nodes() if not n.children}
        assert leaves == self._leaves_set, "leaf index drift"
        everything = held + list(in_flight_slots) + self.allocator.free_slots()
        assert len(everything) == self.allocator.size, (
            f"slot accounting: {len(held)} held + {len(in_flight_slots)} in flight + "
            f"{self.allocator.available} free != {self.allocator.size}"
        )
        assert len(set(everything)) == self.allocator.size, "a slot is owned twice (orphan or double free)"
