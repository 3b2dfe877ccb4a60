"""Session-aware eviction: keep what live agent sessions will read next.

`get_priority(node)` (SGLang's shape, lower is evicted first) estimates when the node will next
be read and evicts the farthest first, like an online approximation of Belady's rule:

- tier 0 (dead): every session that ran through the node is closed, or abandoned that branch
  (rolled back past it). Evicted first, least recently used first.
- tier 1 (live), ordered by -(estimated seconds to the next read), where per session
  (`SessionRegistry.gap`): in flight or resumed -> 0; idle -> the time since its last activity
  (so idle sessions go by recency); waiting on a tool -> the time left to the hint's deadline while
  it lies ahead (a time-to-live protection that lapses when it runs out), else recency, blended
  with what finished waits taught in proportion to how many of them the estimate rests on. A node
  takes the soonest of its live sessions, divided by a sharing factor that grows with the number
  of live sessions using it and, for shared prefixes, with its recompute cost (length).
- A node with no session information at all gets `last_access_time - now`: with no sessions
  anywhere, the order is exactly LRU's.

Reads only: the registry (`SessionRegistry`) and the node's fields. The node's sessions come
from `node.sessions` (our tree) or, for trees without that field (SGLang), from the registry's
side table `node_sessions` keyed by node id, which a plugin fills.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from runtime.cache.sessions import SessionRegistry

DEAD, LIVE = 0, 1


class SessionPolicy:
    def __init__(
        self,
        sessions: SessionRegistry | None = None,
        clock: Callable[[], float] | None = None,
        share_weight: float = 1.0,
        cost_weight: float = 0.5,
        cost_unit: int = 256,
    ) -> None:
        if share_weight < 0 or cost_weight < 0 or cost_unit <= 0:
            raise ValueError("share_weight and cost_weight must be >= 0, cost_unit > 0")
        self.sessions = sessions if sessions is not None else SessionRegistry()
        self.clock = clock or self.sessions.clock
        self.share_weight = share_weight
        self.cost_weight = cost_weight
        self.cost_unit = cost_unit
        #: node id -> session ids, for trees whose nodes carry no `sessions` set (SGLang)
        self.node_sessions: dict[int, set[str]] = {}

    def sessions_of(self, node: object) -> set[str]:
        found = getattr(node, "sessions", None)
        if found is None:
            found = self.node_sessions.get(getattr(node, "id", -1), ())
        return found  # type: ignore[return-value]

    def get_priority(self, node: object) -> tuple[int, float]:
        now = self.clock()
        sids = self.sessions_of(node)
        last = node.last_access_time  # type: ignore[attr-defined]
        if not sids:
            return (LIVE, last - now)
        abandoned = self.sessions.abandoned_by(node.id) or ()  # type: ignore[attr-defined]
        gap_of = self.sessions.gap
        best, live = math.inf, 0
        for sid in sids:
            if sid in abandoned:
                continue
            gap = gap_of(sid, now)
            if gap is None:
                continue
            live += 1
            if gap < best:
                best = gap
        if not live:
            return (DEAD, last)
        if live > 1:
            cost = 1.0 + self.cost_weight * math.log1p(len(node.key) / self.cost_unit)  # type: ignore[attr-defined]
            best /= (1.0 + self.share_weight * (live - 1)) * cost
        return (LIVE, -best)
