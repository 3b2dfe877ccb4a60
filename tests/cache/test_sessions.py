from __future__ import annotations

from runtime.cache.kv_pool import SlotAllocator
from runtime.cache.manager import RadixCacheManager
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
        manager = RadixCacheManager(cache)
        lease = manager.start(key, len(key), session_id=sid)
        manager.release(lease, key, len(key), insert=True)
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
    assert m.estimate(5.0) == (5.0, 1)  # resting on the single wait longer than 5 s
    assert m.estimate(0.0) == ((1 + 3 + 10) / 3, 3)


def test_sparse_tail_estimate_defers_to_recency() -> None:
    """A wait that outlasted all but one past wait is not judged by that one wait alone."""
    clock = Clock()
    reg = SessionRegistry(clock=clock)
    for _ in range(40):  # 41 finished unhinted waits: 40 took 2 s, then one took 31 s
        reg.on_request("w")
        reg.on_request_done("w")
        reg.on_event("w", "tool_wait", expected_s=None)
        clock.t += 2.0
    reg.on_request("w")
    reg.on_request_done("w")
    reg.on_event("w", "tool_wait", expected_s=None)
    clock.t += 31.0
    reg.on_request("w")
    reg.on_request_done("w")
    for sid, waited in (("long", 30.0), ("fresh", 0.5)):
        reg.on_request(sid)
        reg.on_request_done(sid)
        reg.on_event(sid, "tool_wait", expected_s=None)
        reg.get(sid).wait_started = reg.get(sid).last_activity = clock.t - waited
    assert reg.waits[""].residual(30.0) == 1.0  # the raw estimate: back in 1 s
    long_gap, fresh_gap = reg.gap("long", clock.t), reg.gap("fresh", clock.t)
    assert long_gap == (1 * 1.0 + 16 * 30.0) / (1 + 16)  # mostly the prior: 30 s since its last activity
    assert fresh_gap < long_gap  # so, as by recency, the fresh wait is kept and the long one goes first
    reg.prior_weight = 0.0  # the raw estimate would have protected the overdue wait instead
    assert reg.gap("long", clock.t) == 1.0 < reg.gap("fresh", clock.t)


def test_idle_sessions_expire_and_tool_models_are_bounded() -> None:
    now = [0.0]
    reg = SessionRegistry(clock=lambda: now[0], idle_timeout_s=100.0)
    reg.on_request("busy")  # in flight: never expires
    reg.on_event("quiet", "open")
    reg.on_event("waiting", "open")
    reg.on_event("waiting", "tool_wait", expected_s=500.0)  # deadline still ahead at t=150
    now[0] = 150.0
    assert reg.expire_idle(now[0]) == 1
    assert not reg.is_open("quiet") and reg.is_open("busy") and reg.is_open("waiting")
    reg.on_request("quiet")  # a request reopens an expired session
    assert reg.is_open("quiet")
    for i in range(SessionRegistry.MAX_TOOLS + 10):
        sid = f"t{i}"
        reg.on_event(sid, "open")
        reg.on_event(sid, "tool_wait", tool=f"tool-{i}")
        reg.on_request(sid)
    assert len(reg.waits) == SessionRegistry.MAX_TOOLS
    assert "" in reg.waits


def test_opening_many_sessions_sweeps_the_idle_ones() -> None:
    now = [0.0]
    reg = SessionRegistry(clock=lambda: now[0], idle_timeout_s=10.0)
    for i in range(SessionRegistry.SWEEP_EVERY - 1):
        reg.on_event(f"old{i}", "open")
    now[0] = 60.0
    reg.on_event("new", "open")  # the 256th open sweeps
    assert len(reg) == 1 and reg.is_open("new")
