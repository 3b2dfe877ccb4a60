"""The one owner of the prefix cache: tree, slot pool and every running request's KV.

A caller (the engine's scheduler, the eviction simulator, tests) never touches the tree or the
pool itself; it holds a `Lease` per running request and calls, in this order:

    lease = manager.start(key, reserve, ...)   # match + lock + alloc (evicting), one tree walk
    manager.extend(lease, n)                   # n more slots (decode), evicting when short
    manager.publish(lease, ids, upto)          # insert ids[:upto]; the lock moves to its end
    manager.release(lease, ids, computed, insert=...)  # insert what was computed, free, unlock

What mutates: `start` splits a node at a partial match and touches access times along the path;
`start`/`extend` may evict unlocked leaves (lowest `policy.get_priority` first); `publish` adds
nodes (slots of positions the tree already had stay the lease's until release, so a request
reads only K/V it computed or matched); `release` frees the rest and unlocks.
A lease's `slots` stay valid while the lease is live: its matched path is locked, the rest is
owned by the lease. Nothing else is safe to hold across a call that allocates.

`RadixCacheManager` shares KV between requests; `NoCacheManager` (the uncached baseline,
`disable_radix_cache`) implements the same interface and never matches or inserts. A lease
started with `prefix_cache=False` (the request's own switch) behaves the same way.

Hooks for other layers (tiered storage, miss analysis): `CacheHooks.on_evict(node)` runs for
every leaf the tree evicts, before its slots are freed; `CacheHooks.on_miss(lease, key)` runs
when `start` matched less than the whole key of a sharing lease.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from runtime.cache.kv_pool import SlotAllocator
from runtime.cache.radix import CacheCounters, RadixCache, TreeNode
from runtime.errors import PoolExhausted

#: most slots a lease holds ahead for decode (`Lease.spare`); the rest it asks for as it goes
SPARE_MAX = 256

if TYPE_CHECKING:
    from runtime.cache.tier.hooks import TierHooks
    from runtime.model.hf_model import HFModel
    from runtime.model.model import LlamaModel


class RequestKV(Protocol):
    """How a running request reaches its K/V (the engine: a view of the pool through the lease's
    slots, runtime/cache/request_kv.py; the simulator has none). `take` gets the lease's own slot
    list, which the manager grows (`extend`) and rebinds (`publish`) in place."""

    def take(self, slots: list[int], cached: int) -> object: ...
    def copy(self, src: Sequence[int], dst: Sequence[int]) -> None: ...
    @property
    def held_bytes(self) -> int: ...


@dataclass(slots=True, eq=False)
class Lease:
    """One running request's hold on the cache. Only the manager mutates it."""

    namespace: str
    session_id: str | None
    priority: int
    shares: bool  # matches and inserts (False: uncached baseline or prefix_cache=False)
    cached_len: int = 0  # prompt tokens served from the tree (what the request reports)
    evicted_len: int = 0  # key tokens after cached_len the tree held and evicted (miss causes)
    tier_len: int = 0  # of cached_len, tokens loaded from the KV tier's store for this lease
    tree_len: int = 0  # leading positions whose slots the tree owns, locked through `node`
    node: TreeNode | None = None  # deepest locked node (None when the lease never shares)
    slots: list[int] = field(default_factory=list)  # one KV slot per position (cached + reserved)
    #: slots of positions this lease computed that the tree already held when it published: the
    #: request keeps reading its own copy (bytes from its own chunks), freed at release
    dups: list[int] = field(default_factory=list)
    #: free slots held right after `slots` for the next positions (decode), so they stay one run
    spare: list[int] = field(default_factory=list)
    kv: object | None = None  # the request's buffer from `RequestKV.take`, when there is one


@dataclass(slots=True)
class CacheHooks:
    on_evict: Callable[[TreeNode], None] | None = None
    on_miss: Callable[[Lease, Sequence[int]], None] | None = None


@dataclass(frozen=True, slots=True)
class CacheSnapshot:
    """Figures for stats and metrics, read under the engine's lock."""

    tokens_in_use: int  # tokens held by the tree
    evictable_tokens: int
    protected_tokens: int
    pool_capacity_tokens: int
    pool_free_tokens: int
    leases: int
    kv_bytes_held: int  # all the K/V held (`RequestKV.held_bytes`: the pool; requests add none)
    counters: CacheCounters


class RadixCacheManager:
    """Match → lock → alloc → insert → free → unlock over a `RadixCache` and its allocator."""

    def __init__(
        self, tree: RadixCache, kv: RequestKV | None = None, hooks: CacheHooks | None = None
    ) -> None:
        self.tree = tree
        self.pool: SlotAllocator = tree.allocator
        self.kv = kv
        self.hooks = hooks or CacheHooks()
        tree.on_evict = self.hooks.on_evict
        self.tier: TierHooks | None = None  # the second KV tier, once `attach_tier` installs it
        self.leases: set[Lease] = set()

    # ---- reading ------------------------------------------------------------------------
    def shares(self, prefix_cache: bool) -> bool:
        """Whether a request asking `prefix_cache` gets a lease that matches and inserts (the
        engine asks once, when it builds the request)."""
        return prefix_cache

    def peek(self, key: Sequence[int], namespace: str, prefix_cache: bool = True) -> int:
        """Leading tokens of `key` the tree would serve now; changes nothing."""
        return self.tree.cached_length(key, namespace) if self.shares(prefix_cache) else 0

    def holds(self, node: TreeNode) -> bool:
        """Whether a node a lease published is still in the tree (its slots still the same KV)."""
        return self.tree.attached(node)

    def room(self) -> int:
        """Slots the pool could hand out now, evicting every unlocked leaf (an unlocked node has
        no locked descendant, so all of `evictable_size` can go)."""
        return self.pool.available + self.tree.evictable_size

    # ---- a request's life -----------------------------------------------------------------
    def start(
        self,
        key: Sequence[int],
        reserve: int,
        namespace: str = "",
        session_id: str | None = None,
        priority: int = 0,
        prefix_cache: bool = True,
        grow: int = 0,
    ) -> Lease:
        """Match `key` (the part of the prompt the cache may serve), lock the match and allocate
        slots up to `reserve` positions (`grow`: how many more decode will likely ask for). With
        a `RequestKV`, the positions are one run of slots where free space allows (see
        `_one_run`) and the request gets its view of them. Raises `PoolExhausted` when eviction
        cannot make room; on any error nothing stays locked or taken."""
        lease = Lease(namespace, session_id, priority, self.shares(prefix_cache))
        if lease.shares:
            if self.tier is not None:  # stored pages continuing the tree's prefix go into it first
                lease.tier_len = self.tier.extend(self.tree, key, namespace, self.adopt, priority, session_id)
            match = self.tree.match_prefix(key, namespace, session_id)
            lease.node, lease.slots = match.node, list(match.slots)
            lease.cached_len = lease.tree_len = match.length
            if self.tree.evictions is not None:
                lease.evicted_len = self.tree.evictions.reach(match.node, key, match.length)
            self.tree.lock(match.node)
            if match.length < len(key) and self.hooks.on_miss is not None:
                self.hooks.on_miss(lease, key)
        try:
            if not self._one_run(lease, reserve, grow):
                lease.slots += self._alloc(max(0, reserve - lease.cached_len), lease.slots)
            if self.kv is not None:
                lease.kv = self.kv.take(lease.slots, lease.cached_len)
        except BaseException:  # PoolExhausted, or a failing buffer: what was locked or taken goes back
            self._drop(lease)
            raise
        self.leases.add(lease)
        return lease

    def extend(self, lease: Lease, n: int) -> None:
        """n more slots at the end of the lease: its spare ones first, then from the pool
        (evicting when the pool is short)."""
        held = min(n, len(lease.spare))
        if held:
            lease.slots += lease.spare[:held]
            del lease.spare[:held]
        if n > held:
            lease.slots += self._alloc(n - held, lease.slots)

    def publish(self, lease: Lease, ids: Sequence[int], upto: int) -> bool:
        """Insert `ids[:upto]` (positions the lease computed or matched) into the tree; the lock
        moves to the new path end. Slots holding KV the tree already had are freed. True when
        the tree's copy of `ids[:upto]` is now the KV the lease read (no position computed twice)."""
        if not lease.shares:
            return False
        if upto <= lease.tree_len:
            return True
        assert lease.node is not None
        key = list(ids[:upto])
        done = self.tree.insert(key, lease.slots[:upto], lease.namespace, lease.priority, lease.session_id)
        # The tree adopts slots[present:upto] where they are (their KV is written already). The
        # positions it held before were computed twice: the request keeps reading its own copy
        # (another chunking may round a row differently), those slots are freed at release.
        own = done.present <= lease.tree_len
        lease.dups += lease.slots[lease.tree_len : done.present]
        if self.tier is not None:  # write_through stores what was just published
            self.tier.on_publish(lease.namespace, key, done.slots, done.present)
        self.tree.lock(done.node)
        self.tree.unlock(lease.node)
        lease.node, lease.tree_len = done.node, upto
        return own

    def release(self, lease: Lease, ids: Sequence[int], computed: int, insert: bool) -> None:
        """End the lease: with `insert`, publish the first `computed` positions; free the rest,
        unlock, hand the buffer back. The lease is dead afterwards."""
        if insert and computed > 0:
            self.publish(lease, ids, computed)
        if self.tier is not None and lease.shares and lease.session_id is not None and computed > 0:
            self.tier.remember(lease.session_id, lease.namespace, list(ids[:computed]))  # prefetch
        self._drop(lease)

    def _drop(self, lease: Lease) -> None:
        self.pool.free(lease.slots[lease.tree_len :] + lease.dups + lease.spare)
        if lease.node is not None:
            self.tree.unlock(lease.node)
        self.leases.discard(lease)
        lease.slots, lease.dups, lease.spare, lease.kv, lease.node = [], [], [], None, None

    # ---- memory -------------------------------------------------------------------------
    def _alloc(self, n: int, behind: list[int]) -> list[int]:
        """n slots, right after `behind`'s last one where those are free (one run: attention
        reads it as a view), evicting when the pool is short."""
        if n > self.pool.available:
            self.evict(n - self.pool.available)
        if n > self.pool.available:
            self._reclaim_spare()
        return self.pool.alloc(n, behind[-1] if behind else None)

    def _reclaim_spare(self) -> None:
        """Give every lease's held decode slots back to the pool: they were taken from free
        slots as a convenience (one run), so they must never make a request fail for room."""
        for lease in self.leases:
            if lease.spare:
                self.pool.free(lease.spare)
                lease.spare = []

    def _one_run(self, lease: Lease, reserve: int, grow: int) -> bool:
        """With a `RequestKV` (the engine): put the lease's `reserve` positions in one run of
        free slots and hold up to SPARE_MAX more right after it for decode (`Lease.spare`:
        without them a neighbour's run starts there and the next token lands elsewhere), so
        attention reads the request as a view of the pool on every step. A scattered set is
        gathered per layer and step instead (at 4k tokens 2.6 ms against 0.4 ms a layer,
        measured: decode at half speed). A matched prefix whose own slots cannot simply be
        continued is copied once into the run (`RequestKV.copy`: the copies are the lease's,
        freed at release; the tree keeps its own). Free slots only: it never evicts. False:
        nothing taken, the ordinary allocation follows."""
        m = lease.cached_len
        if self.kv is None or reserve <= 0:
            return False
        spare = min(grow, SPARE_MAX)
        new = max(reserve, m) - m
        if m and _is_run(lease.slots):  # the prefix's own run, continued where its next slots are free
            after = lease.slots[-1]
            for room in dict.fromkeys((spare, 0)):
                if self.pool.free_run(new + room, after) == after + 1:
                    run = self.pool.take_run(after + 1, new + room) if new + room else []
                    lease.slots += run[:new]
                    lease.spare = run[new:]
                    return True
        for room in dict.fromkeys((spare, 0)):
            first = self.pool.free_run(m + new + room)
            if first is not None:
                break
        else:
            return False
        run = self.pool.take_run(first, m + new + room)
        if m:
            self.kv.copy(lease.slots, run[:m])
            lease.dups += run[:m]
        lease.slots, lease.spare = run[: m + new], run[m + new :]
        return True

    def adopt(
        self,
        key: Sequence[int],
        have: int,
        n: int,
        namespace: str = "",
        priority: int = 0,
        session_id: str | None = None,
        fill: Callable[[list[int]], None] | None = None,
    ) -> int:
        """Put `key[have:have+n]`, whose K/V comes from below the pool (the KV tier), into the
        tree after its resident prefix `key[:have]`: lock that prefix while allocating (which may
        evict others), `fill(slots)` writes the K/V, insert, unlock. Returns the tokens the tree
        gained (0 when eviction cannot make room: nothing changed)."""
        resident = self.tree.find_node(key[:have], namespace)  # splits at `have`: its slots cover it
        self.tree.lock(resident.node)
        try:
            slots = self._alloc(n, list(resident.slots))
        except PoolExhausted:
            return 0
        finally:
            self.tree.unlock(resident.node)
        if fill is not None:
            fill(slots)
        done = self.tree.insert(key[: have + n], resident.slots + slots, namespace, priority, session_id)
        self.pool.free(slots[: max(0, done.present - have)])  # a twin got there first
        return have + n - max(done.present, have)

    # ---- the second tier ----------------------------------------------------------------
    def attach_tier(self, tier: TierHooks) -> None:
        """Install the KV tier (runtime/cache/tier/hooks.py): evicted leaves are demoted to its
        store before their slots are freed, `start` loads stored pages continuing the tree's
        prefix, `publish` writes through when its policy says so, `release` remembers each
        session's context for prefetch. All of it runs on the caller's (worker) thread."""
        self.tier = tier
        previous = self.tree.on_evict

        def on_evict(node: TreeNode) -> None:
            tier.on_evict(node)
            if previous is not None:
                previous(node)

        self.tree.on_evict = on_evict

    def prefetch_due(self) -> int:
        """Load the contexts of sessions whose tool is about to return; returns tokens loaded."""
        return 0 if self.tier is None else self.tier.run_due(self.tree, self.adopt, self.room)

    def next_prefetch_in(self) -> float | None:
        """Seconds until the tier's next scheduled prefetch (None: none, or no tier)."""
        return None if self.tier is None else self.tier.next_due_in()

    @property
    def storage_backend(self) -> str | None:
        """The tier's store ("file", "redis"), reported with the tokens it served; None without one."""
        return None if self.tier is None else self.tier.backend

    def weights_changed(self, model: LlamaModel | HFModel) -> None:
        """After a weights swap (the tree already emptied): stored pages computed under the old
        weights become unreachable, since the tier's keys follow the weights' fingerprint."""
        if self.tier is not None:
            self.tier.refingerprint(model)

    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` slots from unlocked leaves, lowest priority first."""
        return self.tree.evict(num_tokens)

    def reset(self) -> None:
        """Empty the tree (weights swap, flush). Only with no lease live."""
        if self.leases:
            raise RuntimeError("cannot reset the cache while requests hold leases")
        self.tree.reset()

    def snapshot(self) -> CacheSnapshot:
        return CacheSnapshot(
            tokens_in_use=self.tree.total_size,
            evictable_tokens=self.tree.evictable_size,
            protected_tokens=self.tree.protected_size,
            pool_capacity_tokens=self.pool.size,
            pool_free_tokens=self.pool.available,
            leases=len(self.leases),
            kv_bytes_held=self.kv.held_bytes if self.kv is not None else 0,
            counters=self.tree.counters,
        )

    def check_integrity(self) -> None:
        """Tree (sizes, leaves, lock order), pool (every slot exactly one of free / tree /
        lease) and locks (each sharing lease's path locked; nothing locked with no lease). Raises
        AssertionError."""
        in_flight = [s for le in self.leases for s in le.slots[le.tree_len :] + le.dups + le.spare]
        self.tree.check_integrity(in_flight)
        for le in self.leases:
            assert le.tree_len <= len(le.slots), "lease owns fewer slots than its tree part"
            assert (le.node is not None) == le.shares, "sharing lease without a locked node"
            assert le.node is None or le.node.parent is None or le.node.lock_ref > 0, "lease path unlocked"
        if not any(le.shares for le in self.leases):
            assert self.tree.protected_size == 0, f"{self.tree.protected_size} tokens locked with no lease"


def _is_run(slots: Sequence[int]) -> bool:
    return bool(slots) and list(slots) == list(range(slots[0], slots[0] + len(slots)))


class NoCacheManager(RadixCacheManager):
    """The uncached baseline: the same interface, no lease ever matches or inserts, so the tree
    stays empty and every slot goes back to the pool at release."""

    def shares(self, prefix_cache: bool) -> bool:
        return False
