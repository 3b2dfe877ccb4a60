"""Replays a Mooncake trace through the engine's own cache manager (`RadixCacheManager` over
`RadixCache`, `SlotAllocator` and the policies): no copy of the match/lock/alloc/insert/free routine.

One tree key unit = one 512-token block (page size 1 on blocks); capacity is in blocks. Two modes:

- `hitrate`: requests in timestamp order, each matched, then its prompt inserted (evicting through
  the policy when the pool is full); nothing is in flight. This is how Mooncake's Table 1 computes
  cache hit rates.
- `timed`: requests arrive at their timestamps and run for a duration from `CostModel` (prefill of
  the uncached prompt tokens + decode of the output). While running, a request locks its matched
  prefix and holds KV for its uncached prompt blocks and its output; a request that cannot get
  that KV even after eviction waits (FIFO; the head keeps its matched prefix locked, and matches
  again only when the tree has grown a longer prefix for it, so retries do not inflate hit counts). At finish
  its prompt blocks join the tree and the output's are freed (output KV has no block ids in the
  trace, so no later request can name it). Compute is not a shared resource here: the pool is.

The oracle is Belady's rule over the same tree: evict the leaf whose first block is next read
farthest in the future (prefix ids make a parent's next read no later than its child's, so the
leaves are the right candidates).
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from evals.eviction.mooncake import Trace, seen_prefix
from runtime.cache.kv_pool import SlotAllocator
from runtime.cache.manager import Lease, RadixCacheManager
from runtime.cache.policies import make_policy
from runtime.cache.radix import EvictionPolicy, RadixCache, TreeNode
from runtime.cache.sessions import SessionRegistry
from runtime.errors import PoolExhausted

POLICIES = ("lru", "lfu", "fifo", "slru", "priority", "session", "oracle")
MODES = ("hitrate", "timed")
TICK_EVERY = 256  # requests between progress callbacks


@dataclass(frozen=True, slots=True)
class CostModel:
    """Seconds per token, held by a running request. Defaults: the Mooncake paper's setting for its
    traces (LLaMA3-70B on 8xA800, FAST'25 Table 1 and Eq. 1): prefill = the linear FLOP term
    l*b*d^2 / G = 80*22*8192^2 / (8*312e12) = 4.7e-5 s per uncached token (0.05 ms; the quadratic
    attention term and MFU below 100% left out), decode = its 100 ms TBT threshold per output token.
    This engine's own CPU figures (SmolLM2-135M fp32, 2 threads) would be ~2 ms/token prefill and
    ~80 ms/token decode (`--prefill-ms-per-token` / `--decode-ms-per-token`, trace_cli.py)."""

    prefill_s_per_token: float = 0.00005
    decode_s_per_token: float = 0.100

    def __post_init__(self) -> None:
        if not (self.prefill_s_per_token >= 0 and self.decode_s_per_token >= 0):
            raise ValueError("cost model: prefill and decode seconds per token must be >= 0")

    def duration(self, uncached_tokens: int, output_tokens: int) -> float:
        return self.prefill_s_per_token * uncached_tokens + self.decode_s_per_token * output_tokens


@dataclass(slots=True)
class ReplayResult:
    mode: str
    policy: str
    capacity_blocks: int | None
    requests: int = 0
    prompt_blocks: int = 0
    cached_blocks: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    recomputed_tokens: int = 0  # prompt tokens an earlier request had computed, not served from cache
    evicted_blocks: int = 0
    queue_wait_s: float = 0.0
    makespan_s: float = 0.0  # timed: virtual time of the last finish
    seconds: float = 0.0  # wall time of the replay
    cpu_seconds: float = 0.0

    @property
    def block_hit_rate(self) -> float:
        return self.cached_blocks / self.prompt_blocks if self.prompt_blocks else 0.0

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class _Clock:
    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class BeladyPolicy:
    """Offline oracle in SGLang's policy shape: the farthest next use is evicted first.

    `cursor` is the first request not yet matched; it only moves forward, so each block's
    occurrence list is walked once over the whole replay (eviction asks for every leaf)."""

    def __init__(self, trace: Trace) -> None:
        # prefix ids are dense (0 .. distinct_blocks - 1): lists index faster than dicts hash
        self._occ: list[list[float]] = [[] for _ in range(trace.distinct_blocks)]
        for i, r in enumerate(trace.requests):
            for b in r.blocks:
                self._occ[b].append(i)
        for occ in self._occ:
            occ.append(math.inf)  # sentinel: never read again
        self._ptr = [0] * trace.distinct_blocks
        self.cursor = 0

    def next_use(self, block: int) -> float:
        occ, p = self._occ[block], self._ptr[block]
        if occ[p] < self.cursor:
            cursor = self.cursor
            while occ[p] < cursor:
                p += 1
            self._ptr[block] = p
        return occ[p]

    def get_priority(self, node: TreeNode) -> tuple[float, float]:
        block = node.key[0]  # next_use inlined: called for every unlocked leaf at every eviction
        occ, p = self._occ[block], self._ptr[block]
        if occ[p] < self.cursor:
            cursor = self.cursor
            while occ[p] < cursor:
                p += 1
            self._ptr[block] = p
        return (-occ[p], node.last_access_time)


def _policy(name: str, trace: Trace, clock: _Clock) -> tuple[EvictionPolicy, BeladyPolicy | None]:
    if name == "oracle":
        oracle = BeladyPolicy(trace)
        return oracle, oracle
    if name == "session":  # no hints: an empty registry, so only what the tree records counts
        return make_policy("session", sessions=SessionRegistry(clock=clock)), None
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose from {list(POLICIES)}")
    return make_policy(name), None


def _pool_size(trace: Trace, mode: str, capacity: int | None) -> int:
    if capacity is not None:
        if capacity <= 0:
            raise ValueError(f"capacity must be a positive number of blocks, got {capacity}")
        biggest = max(r.footprint_blocks for r in trace.requests)
        if mode == "timed" and capacity < biggest:
            raise ValueError(
                f"capacity {capacity} blocks is below the largest request's footprint "
                f"({biggest} blocks of prompt + output): the timed replay could never run it"
            )
        return capacity
    return trace.distinct_blocks + sum(r.footprint_blocks for r in trace.requests) + 1


def replay(
    trace: Trace,
    mode: str,
    policy: str,
    capacity: int | None,
    cost: CostModel | None = None,
    tick: Callable[[int], None] | None = None,
    check: bool = False,
) -> ReplayResult:
    """One replay; `capacity` None = infinite. `tick(n)` reports n more requests done; `check`
    runs the cache manager's integrity check at the end (tests)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {list(MODES)}")
    start, cpu = time.perf_counter(), time.process_time()
    out = ReplayResult(mode, policy, capacity)
    clock = _Clock()
    pol, nu = _policy(policy, trace, clock)
    tree = RadixCache(SlotAllocator(_pool_size(trace, mode, capacity)), pol, clock=clock)
    manager = RadixCacheManager(tree)  # the engine's match/lock/alloc/insert/free, no model
    runner = _HitRate if mode == "hitrate" else _Timed
    runner(trace, manager, clock, nu, out, cost or CostModel(), tick or (lambda n: None)).run()
    if check:
        manager.check_integrity()
    out.evicted_blocks = tree.counters.evicted_tokens
    out.seconds, out.cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    return out


class _Base:
    def __init__(
        self,
        trace: Trace,
        manager: RadixCacheManager,
        clock: _Clock,
        nu: BeladyPolicy | None,
        out: ReplayResult,
        cost: CostModel,
        tick: Callable[[int], None],
    ) -> None:
        self.trace, self.manager, self.clock = trace, manager, clock
        self.nu, self.out, self.cost, self.tick = nu, out, cost, tick
        self.seen: set[int] = set()  # blocks an earlier (finished) request computed

    def _account(self, i: int, cached: int) -> int:
        """Counts request i's match of `cached` blocks; returns its cached tokens."""
        r, out = self.trace.requests[i], self.out
        ideal = seen_prefix(r.blocks, self.seen)
        tokens = r.tokens_in(cached)
        out.requests += 1
        out.prompt_blocks += len(r.blocks)
        out.cached_blocks += cached
        out.prompt_tokens += r.input_length
        out.cached_tokens += tokens
        out.recomputed_tokens += max(0, r.tokens_in(ideal) - tokens)
        if out.requests % TICK_EVERY == 0:
            self.tick(TICK_EVERY)
        return tokens

    def _start(self, i: int) -> Lease:
        """Match and lock request i's prompt blocks; no slots yet."""
        if self.nu is not None:
            self.nu.cursor = i + 1  # request i's own blocks are locked or about to be inserted
        return self.manager.start(self.trace.requests[i].blocks, reserve=0)


class _HitRate(_Base):
    def run(self) -> None:
        manager = self.manager
        for i, r in enumerate(self.trace.requests):
            self.clock.now = float(i)  # one tick per request: recency in request order, no ties
            lease = self._start(i)
            self._account(i, lease.cached_len)
            # a prompt larger than the pool keeps what fits
            take = min(len(r.blocks) - lease.cached_len, manager.room())
            manager.extend(lease, take)
            manager.release(lease, r.blocks, lease.cached_len + take, insert=True)
            self.seen.update(r.blocks)
        self.tick(self.out.requests % TICK_EVERY)


class _Timed(_Base):
    def run(self) -> None:
        reqs = self.trace.requests
        self.running: dict[int, Lease] = {}
        self.finishes: list[tuple[float, int]] = []
        self.queue: deque[int] = deque()
        self.head: Lease | None = None  # the queue head's lease, its match locked while it waits
        nxt = 0
        while nxt < len(reqs) or self.finishes:
            if self.finishes and (nxt == len(reqs) or self.finishes[0][0] <= reqs[nxt].arrival_s):
                t, i = heapq.heappop(self.finishes)
                self.clock.now = t
                self._finish(i)
            else:
                self.clock.now = reqs[nxt].arrival_s
                self.queue.append(nxt)
                nxt += 1
            self._drain()
        assert not self.queue and not self.running, "requests left over: the pool cannot hold one"
        self.out.makespan_s = self.clock.now
        self.tick(self.out.requests % TICK_EVERY)

    def _drain(self) -> None:
        manager = self.manager
        while self.queue:
            i = self.queue[0]
            r = self.trace.requests[i]
            if self.head is not None and manager.peek(r.blocks, "") > self.head.cached_len:
                manager.release(self.head, r.blocks, 0, insert=False)  # the tree grew: match again
                self.head = None
            if self.head is None:
                self.head = self._start(i)
            lease = self.head
            try:  # KV for the uncached prompt blocks and the output, evicting when short
                manager.extend(lease, r.footprint_blocks - lease.cached_len)
            except PoolExhausted:
                return  # waits, its match still locked
            self.queue.popleft()
            self.head = None
            tokens = self._account(i, lease.cached_len)
            self.out.queue_wait_s += self.clock.now - r.arrival_s
            self.running[i] = lease
            done = self.clock.now + self.cost.duration(r.input_length - tokens, r.output_length)
            heapq.heappush(self.finishes, (done, i))

    def _finish(self, i: int) -> None:
        """The prompt blocks join the tree (a twin's copy wins); the output's KV is freed: it has
        no block ids, nobody can read it again."""
        r = self.trace.requests[i]
        self.manager.release(self.running.pop(i), r.blocks, len(r.blocks), insert=True)
        self.seen.update(r.blocks)
