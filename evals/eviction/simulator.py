"""Trace-driven replay of a `Workload` over the engine's own cache manager (no model).

Virtual time, event-driven. A request arrives, matches its prompt in the tree, locks the match
and allocates slots for its uncached prompt suffix and its output (in-flight KV); when the pool
is short it evicts through the policy under test, and if even that cannot make room it waits in
a FIFO queue until a running request finishes. At finish the prompt + output is inserted and
the lock released. Request durations are fixed by the workload (policy-independent); only the
queueing delay depends on the policy. The pool (`budget` tokens) therefore covers the cached tree
and the requests in flight.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from dataclasses import dataclass, field

from evals.eviction.workloads import Workload
from runtime.cache.kv_pool import SlotAllocator
from runtime.cache.manager import Lease, RadixCacheManager
from runtime.cache.policies import make_policy
from runtime.cache.radix import EvictionPolicy, RadixCache, TreeNode
from runtime.cache.sessions import SessionRegistry
from runtime.errors import PoolExhausted

POLICIES = ("lru", "lfu", "fifo", "slru", "priority", "session", "oracle")
_FINISH, _ARRIVE = 0, 1  # finishes first at equal times: they free memory


@dataclass(slots=True)
class _Session:
    context: list[int]
    step: int = 0
    next_time: float = math.inf  # when it next reads the cache (now if running or queued)
    done: bool = False


@dataclass(slots=True)
class _Request:
    s: int
    prompt: list[int]
    lease: Lease | None = None
    arrived: float = 0.0


@dataclass(slots=True)
class ReplayStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    recomputed_tokens: int = 0
    evicted_tokens: int = 0
    queue_wait_s: float = 0.0
    requests: int = 0
    per_session_recompute: list[int] = field(default_factory=list)
    peak_working_set: int = 0
    seconds: float = 0.0


class OraclePolicy:
    """Offline Belady: evict the leaf whose first token is next read farthest in the future."""

    def __init__(self, replay: Replay) -> None:
        self.replay = replay

    def get_priority(self, node: TreeNode) -> tuple[float, float]:
        return (-self.replay.next_use(node.key[0]), node.last_access_time)


class Replay:
    def __init__(self, workload: Workload, policy: str, budget: int | None) -> None:
        self.w = workload
        self.now = 0.0
        self.registry = SessionRegistry(clock=lambda: self.now)
        pol: EvictionPolicy
        if policy == "oracle":
            pol = OraclePolicy(self)
        elif policy == "session":
            pol = make_policy("session", sessions=self.registry)
        else:
            pol = make_policy(policy)
        self.infinite = budget is None
        size = budget if budget is not None else sum(_footprint(p) for p in workload.sessions) + 1
        self.alloc = SlotAllocator(size)
        self.cache = RadixCache(self.alloc, pol, clock=lambda: self.now)
        self.manager = RadixCacheManager(self.cache)  # the engine's match/lock/alloc/insert/free
        self.sessions = [_Session(list(p.prefix)) for p in workload.sessions]
        self.events: list[tuple[float, int, int, int, _Request | None]] = []
        self.queue: deque[_Request] = deque()
        self.seen: set[int] = set()
        self.stats = ReplayStats(per_session_recompute=[0] * len(workload.sessions))
        self._seq = 0
        self._live_refs: dict[int, int] = {}  # token -> open contexts holding it (infinite run)
        self._working = 0

    # ---- the oracle's knowledge ---------------------------------------------------------
    def next_use(self, token: int) -> float:
        best = math.inf
        for s, first, last in self.w.users[self.w.token_seg[token]]:
            st = self.sessions[s]
            if not st.done and first <= last and st.step <= last and st.next_time < best:
                best = st.next_time
        return best

    # ---- event loop ---------------------------------------------------------------------
    def _push(self, t: float, kind: int, s: int, req: _Request | None = None) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, kind, self._seq, s, req))

    def run(self) -> ReplayStats:
        start = time.perf_counter()
        for s, plan in enumerate(self.w.sessions):
            if plan.start is not None:
                self.sessions[s].next_time = plan.start
                self._push(plan.start, _ARRIVE, s)
        while self.events:
            t, kind, _, s, req = heapq.heappop(self.events)
            self.now = t
            if kind == _ARRIVE:
                self._arrive(s)
            else:
                assert req is not None
                self._finish(req)
                self._drain_queue()
        assert not self.queue, "requests left queued: the budget cannot hold one request"
        self.stats.evicted_tokens = self.cache.counters.evicted_tokens
        self.stats.seconds = time.perf_counter() - start
        return self.stats

    def _arrive(self, s: int) -> None:
        plan, st = self.w.sessions[s], self.sessions[s]
        sid = plan.sid if self.w.events else None
        if sid is not None:
            if st.step == 0:
                self.registry.on_event(sid, "open")
            elif plan.steps[st.step - 1].after == "tool":
                self.registry.on_event(sid, "resume")
            self.registry.on_request(sid)
        st.context.extend(plan.steps[st.step].new_tokens)
        st.next_time = self.now
        self._track(plan.steps[st.step].new_tokens, +1)
        req = _Request(s, list(st.context), arrived=self.now)
        if self.queue or not self._admit(req):
            self.queue.append(req)

    def _admit(self, req: _Request) -> bool:
        plan = self.w.sessions[req.s]
        sid = plan.sid if self.w.events else None
        step = plan.steps[self.sessions[req.s].step]
        try:
            req.lease = self.manager.start(req.prompt, len(req.prompt) + len(step.output), session_id=sid)
        except PoolExhausted:
            return False
        self._account(req, req.lease.cached_len)
        self._push(self.now + step.duration, _FINISH, req.s, req)
        return True

    def _account(self, req: _Request, cached: int) -> None:
        prompt, seen = req.prompt, self.seen
        lo, hi = 0, len(prompt)  # seen is prefix-closed along a prompt: binary-search its end
        while lo < hi:
            mid = (lo + hi) // 2
            if prompt[mid] in seen:
                lo = mid + 1
            else:
                hi = mid
        ideal = lo  # tokens join `seen` when their request finishes (in-flight twins are no miss)
        st = self.stats
        st.requests += 1
        st.prompt_tokens += len(prompt)
        st.cached_tokens += cached
        st.recomputed_tokens += max(0, ideal - cached)
        st.per_session_recompute[req.s] += max(0, ideal - cached)
        st.queue_wait_s += self.now - req.arrived

    def _drain_queue(self) -> None:
        while self.queue and self._admit(self.queue[0]):
            self.queue.popleft()

    def _finish(self, req: _Request) -> None:
        plan, st = self.w.sessions[req.s], self.sessions[req.s]
        step = plan.steps[st.step]
        sid = plan.sid if self.w.events else None
        assert req.lease is not None
        full = req.prompt + step.output
        self.seen.update(full[req.lease.cached_len :])
        self.manager.release(req.lease, full, len(full), insert=True)
        st.context.extend(step.output)
        self._track(step.output, +1)
        if sid is not None:
            self.registry.on_request_done(sid)
        self._after(req.s, step, full, sid)

    def _after(self, s: int, step, full: list[int], sid: str | None) -> None:
        st = self.sessions[s]
        for child in step.spawn:
            self.sessions[child].next_time = self.now
            self._track(self.sessions[child].context, +1)
            self._push(self.now, _ARRIVE, child)
        st.step += 1
        if step.after == "end":
            st.done, st.next_time = True, math.inf
            self._track(st.context, -1)
            if sid is not None:
                self.registry.on_event(sid, "close")
            return
        if step.after == "rollback":
            self._track(st.context[step.keep :], -1)
            del st.context[step.keep :]
            if sid is not None:
                self.registry.on_event(sid, "abandon", cache=self.cache, input_ids=full, keep=step.keep)
        elif sid is not None:
            self.registry.on_event(sid, "tool_wait", expected_s=step.hint, tool=step.tool)
        st.next_time = self.now + step.wait
        self._push(st.next_time, _ARRIVE, s)

    def _track(self, tokens: list[int], delta: int) -> None:
        """Working set (infinite run only): distinct tokens on the live contexts of open sessions."""
        if not self.infinite:
            return
        refs = self._live_refs
        for t in tokens:
            n = refs.get(t, 0) + delta
            if n <= 0:
                refs.pop(t, None)
                self._working -= 1
            else:
                refs[t] = n
                if n == 1 and delta > 0:
                    self._working += 1
        self.stats.peak_working_set = max(self.stats.peak_working_set, self._working)


def _footprint(plan) -> int:
    return len(plan.prefix) + sum(len(s.new_tokens) + len(s.output) for s in plan.steps)


def max_request(workload: Workload) -> int:
    """The largest single request's slots (prompt + output): no budget may be below it."""
    biggest = 0
    for plan in workload.sessions:
        length = len(plan.prefix)
        for step in plan.steps:
            length += len(step.new_tokens)
            biggest = max(biggest, length + len(step.output))
            length = step.keep if step.after == "rollback" else length + len(step.output)
    return biggest


def budget_for(workload: Workload, fraction: float, peak: int) -> int:
    return max(math.ceil(fraction * peak), max_request(workload) + 1)
