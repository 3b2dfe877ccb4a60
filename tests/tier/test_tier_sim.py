"""The simulator's model of the tier: fewer recomputed tokens, never more cached than ideal."""

from __future__ import annotations

from evals.eviction import workloads
from evals.eviction.simulator import Replay, budget_for
from evals.eviction.tier_sim import SimTier, TierReplay


def test_tier_cuts_recompute_and_keeps_accounting():
    make = lambda: workloads.make("agents", 8, 0, (4, 6))  # noqa: E731
    peak = Replay(make(), "lru", None).run().peak_working_set
    budget = budget_for(make(), 0.25, peak)
    off = Replay(make(), "lru", budget).run()
    tier = SimTier(4, None)
    replay = TierReplay(make(), "lru", budget, tier)
    on = replay.run()
    assert on.prompt_tokens == off.prompt_tokens
    assert tier.loaded_tokens > 0 and on.recomputed_tokens < off.recomputed_tokens
    replay.cache.check_integrity()
    bounded = SimTier(4, 8)
    TierReplay(make(), "lru", budget, bounded).run()
    assert len(bounded.store) * 4 <= 8


def test_sim_tier_pages_stop_at_first_missing():
    tier = SimTier(2, None)
    tier.demote(list(range(8)), start=0)  # pages [0,2) [2,4) [4,6) [6,8)
    assert tier.run(list(range(8)), have=0) == 8
    assert tier.run(list(range(8)), have=3) == 5
    assert tier.run([9] + list(range(1, 8)), have=0) == 0  # another first token: other chain
