from __future__ import annotations

from runtime.cache.kv_pool import SlotAllocator
from runtime.cache.policies import make_policy
from runtime.cache.radix import RadixCache
from runtime.cache.sessions import ResidualModel, SessionRegistry


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def test_abandon_marks_branch_after_checkpoint_and_evicts_it_first() -> None:
    clock = Clock()
    reg = SessionRegistry(clock=clock)
    cache = RadixCache(SlotAllocator(32), make_policy("session", sessions=reg), clock=clock)

    def run(sid: str, key: list[int]) -> None:
        reg.on_request(sid)
        m = cache.match_prefix(key, session_id=sid)
        new = cache.allocator.alloc(len(key) - m.length)
        cache.insert(key, m.slots + new, session_id=sid)
        reg.on_request_done(sid)
        clock.t += 1

    run("other", [50, 51, 52, 53])
    run("s", [1, 2, 3, 4, 5, 6, 7, 8])
    reg.on_event("s", "abandon", cache=cache, input_ids=[1, 2, 3, 4, 5, 6, 7, 8], keep=5)
    cache.check_integrity()
    freed = cache.evict(1)
    assert freed == 3  # the abandoned tail [6, 7, 8] goes first, not the older "other" context
    assert cache.match_prefix([1, 2, 3, 4, 5, 6]).length == 5
    assert cache.match_prefix([50, 51, 52, 53]).length == 4
    reg.on_event("s", "close")
    assert not reg.abandoned_by(next(iter(cache._leaves_set)).id)
    cache.check_integrity()


def test_states_follow_events() -> None:
    clock = Clock()
    reg = SessionRegistry(clock=clock)
    state = reg.on_request("a")
    assert state.status == "live"
    reg.on_request_done("a")
    assert state.status == "idle"
    reg.on_event("a", "tool_wait", expected_s=3.0, tool="search")
    assert state.status == "waiting" and state.deadline == 3.0
    clock.t = 2.0
    assert reg.gap("a", clock.t) == 1.0
    reg.on_event("a", "resume")
    assert state.status == "live" and reg.gap("a", 2.0) == 0.0
    reg.on_event("a", "close")
    assert reg.gap("a", 2.0) is None


def test_residual_model() -> None:
    m = ResidualModel(min_samples=2)
    assert m.residual(0.0) is None
    for x in (1.0, 3.0, 10.0):
        m.add(x)
    assert m.residual(0.0) == (1 + 3 + 10) / 3
    assert m.residual(5.0) == 5.0
    assert m.residual(20.0) is None
