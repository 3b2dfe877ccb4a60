"""The KV tier in the eviction simulator (no model, no bytes): the same two hooks as the engine
(runtime/cache/tier/hooks.py) over key sets instead of K/V.

- on eviction a leaf's full pages are "demoted": their chain keys enter the store (LRU-bounded
  in tokens, or unbounded), unless the session policy judges the node dead (dropped);
- before a request matches, stored pages continuing the tree's prefix are "loaded" through the
  cache manager's `adopt` (slots allocated, evicting as any allocation does; the prefix inserted),
  so the match serves it.

Pages are aligned at position 0 and `page` simulated tokens long (4 = 64 real tokens, the
engine's default), so the tail of a context shorter than a page is lost as in the engine.
Loaded tokens count as cached (not recomputed); `loaded_tokens` says how many came from the tier.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from evals.eviction.simulator import Replay, _Request
from evals.eviction.workloads import Workload
from runtime.cache.radix import TreeNode
from runtime.cache.session_policy import DEAD, SessionPolicy


class SimTier:
    def __init__(self, page: int, capacity_tokens: int | None) -> None:
        self.page, self.capacity = page, capacity_tokens
        self.store: OrderedDict[int, None] = OrderedDict()
        self.loaded_tokens = self.demoted_tokens = self.dropped_tokens = 0

    def keys(self, tokens: Sequence[int]) -> list[int]:
        out, prev, p = [], 0, self.page
        for start in range(0, len(tokens) // p * p, p):
            prev = hash((prev, tuple(tokens[start : start + p])))
            out.append(prev)
        return out

    def demote(self, tokens: Sequence[int], start: int) -> None:
        keys = self.keys(tokens)
        for key in keys[start // self.page :]:
            if key in self.store:
                self.store.move_to_end(key)
                continue
            self.store[key] = None
            self.demoted_tokens += self.page
        while self.capacity is not None and len(self.store) * self.page > self.capacity:
            self.store.popitem(last=False)

    def run(self, tokens: Sequence[int], have: int) -> int:
        """Tokens of `tokens` the store continues beyond `have` (a whole-page run)."""
        keys, n = self.keys(tokens), 0
        for i in range(have // self.page, len(keys)):
            if keys[i] not in self.store:
                break
            self.store.move_to_end(keys[i])
            n = i + 1
        return max(0, n * self.page - have)


def _path(node: TreeNode) -> list[int]:
    parts = []
    while node.parent is not None:
        parts.append(node.key)
        node = node.parent
    return [t for k in reversed(parts) for t in k]


class TierReplay(Replay):
    """`Replay` with a tier below the pool (and, with `prefetch`, nothing else: prefetch changes
    when a load happens, which a simulator without load times cannot tell apart)."""

    def __init__(self, workload: Workload, policy: str, budget: int | None, tier: SimTier) -> None:
        super().__init__(workload, policy, budget)
        self.tier = tier
        pol = self.cache.policy
        self._dead = (lambda n: pol.get_priority(n)[0] == DEAD) if isinstance(pol, SessionPolicy) else None
        self.cache.on_evict = self._on_evict

    def _on_evict(self, node: TreeNode) -> None:
        if self._dead is not None and self._dead(node):
            self.tier.dropped_tokens += len(node.key)
            return
        tokens = _path(node)
        self.tier.demote(tokens, len(tokens) - len(node.key))

    def _admit(self, req: _Request) -> bool:
        self._load(req.prompt)
        return super()._admit(req)

    def _load(self, prompt: list[int]) -> None:
        """Stored pages continuing the resident prefix go into the tree through the engine's
        cache manager (`adopt`, as the engine's tier load does), without bytes."""
        have = self.cache.cached_length(prompt)
        n = self.tier.run(prompt, have)
        if n:
            self.tier.loaded_tokens += self.manager.adopt(prompt, have, n)


def tier_grid(sessions: int = 64, budgets: Sequence[float] = (0.25, 0.5), seed: int = 0) -> list[dict]:
    """The agents workload with the tier off (lru, session, oracle) and on (lru, session; store
    unbounded, or bounded to the pool's own size): recomputed prefill tokens, in real tokens."""
    from evals.eviction import workloads
    from evals.eviction.simulator import budget_for
    from evals.eviction.workloads import BLOCK

    def fresh() -> Workload:
        return workloads.make("agents", sessions, seed, None)

    peak = Replay(fresh(), "lru", None).run().peak_working_set
    rows = []
    for frac in budgets:
        budget = budget_for(fresh(), frac, peak)
        base = {
            "workload": "agents",
            "sessions": sessions,
            "budget_fraction": frac,
            "budget_tokens": budget * BLOCK,
        }
        for policy in ("lru", "session", "oracle"):
            st = Replay(fresh(), policy, budget).run()
            rows.append(base | _row(st, policy, "off", None, BLOCK))
        for capacity in (None, budget, 4 * budget):
            for policy in ("lru", "session"):
                tier = SimTier(64 // BLOCK, capacity)
                st = TierReplay(fresh(), policy, budget, tier).run()
                label = (
                    "on (unbounded store)" if capacity is None else f"on (store = {capacity // budget}x pool)"
                )
                rows.append(base | _row(st, policy, label, tier, BLOCK))
    return rows


def _row(st, policy: str, tier_label: str, tier: SimTier | None, block: int) -> dict:
    return {
        "policy": policy,
        "tier": tier_label,
        "prompt_tokens": st.prompt_tokens * block,
        "cached_tokens": st.cached_tokens * block,
        "recomputed_tokens": st.recomputed_tokens * block,
        "hit_rate": st.cached_tokens / st.prompt_tokens if st.prompt_tokens else 0.0,
        "tier_loaded_tokens": (tier.loaded_tokens * block) if tier else 0,
        "tier_dropped_tokens": (tier.dropped_tokens * block) if tier else 0,
    }
