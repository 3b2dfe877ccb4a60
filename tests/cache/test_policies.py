from __future__ import annotations

from runtime.cache.policies import make_policy
from runtime.cache.radix import TreeNode
from runtime.cache.sessions import SessionRegistry


def node(key_len: int = 4, **fields) -> TreeNode:
    n = TreeNode(key=list(range(key_len)), value=list(range(key_len)), parent=None, namespace="")
    for k, v in fields.items():
        setattr(n, k, v)
    return n


def order(policy, nodes: list[TreeNode]) -> list[TreeNode]:
    return sorted(nodes, key=lambda n: (policy.get_priority(n), n.id))


def test_builtin_orders() -> None:
    a = node(last_access_time=3, creation_time=1, hit_count=5, priority=0)
    b = node(last_access_time=1, creation_time=2, hit_count=1, priority=1)
    c = node(last_access_time=2, creation_time=3, hit_count=2, priority=0)
    assert order(make_policy("lru"), [a, b, c]) == [b, c, a]
    assert order(make_policy("fifo"), [a, b, c]) == [a, b, c]
    assert order(make_policy("lfu"), [a, b, c]) == [b, c, a]
    assert order(make_policy("slru"), [a, b, c]) == [b, c, a]
    assert order(make_policy("priority"), [a, b, c]) == [c, a, b]


class Clock:
    t = 100.0

    def __call__(self) -> float:
        return self.t


def test_session_policy_is_lru_without_session_info() -> None:
    clock = Clock()
    policy = make_policy("session", sessions=SessionRegistry(clock=clock))
    nodes = [node(last_access_time=t) for t in (5, 1, 9, 3, 7)]
    assert order(policy, nodes) == order(make_policy("lru"), nodes)


def test_closed_and_abandoned_go_first() -> None:
    clock = Clock()
    reg = SessionRegistry(clock=clock)
    policy = make_policy("session", sessions=reg)
    for sid in ("live", "gone", "rolled"):
        reg.on_request(sid)
        reg.on_request_done(sid)
    reg.on_event("gone", "close")
    old = node(last_access_time=1, sessions={"live"})
    dead = node(last_access_time=99, sessions={"gone"})
    branch = node(last_access_time=99, sessions={"rolled"})
    reg._abandoned[branch.id] = {"rolled"}
    first_two = order(policy, [old, dead, branch])[:2]
    assert set(first_two) == {dead, branch}


def test_tool_wait_ttl_protects_until_expected_return() -> None:
    clock = Clock()
    reg = SessionRegistry(clock=clock)
    policy = make_policy("session", sessions=reg)
    for sid in ("tool", "idle"):
        reg.on_request(sid)
        reg.on_request_done(sid)
    reg.on_event("tool", "tool_wait", expected_s=10.0)
    clock.t = 150.0  # idle for 50 s; the tool is expected back at 110 s... already overdue
    waiting = node(last_access_time=100, sessions={"tool"})
    idle = node(last_access_time=100, sessions={"idle"})
    assert policy.get_priority(waiting) == policy.get_priority(idle)  # TTL ran out: recency
    reg.on_event("tool", "tool_wait", expected_s=5.0)
    clock.t = 151.0
    assert order(policy, [waiting, idle]) == [idle, waiting]  # back in 4 s beats idle 51 s


def test_shared_prefix_is_protected() -> None:
    clock = Clock()
    reg = SessionRegistry(clock=clock)
    policy = make_policy("session", sessions=reg)
    for sid in ("a", "b", "c"):
        reg.on_request(sid)
        reg.on_request_done(sid)
    clock.t = 120.0
    shared = node(last_access_time=100, sessions={"a", "b", "c"})
    private = node(last_access_time=110, sessions={"a"})
    assert order(policy, [shared, private]) == [private, shared]


def test_unknown_session_events_raise() -> None:
    import pytest

    from runtime.errors import InvalidRequest, UnknownSession

    reg = SessionRegistry()
    for event in ("resume", "tool_wait", "abandon", "close"):
        with pytest.raises(UnknownSession):
            reg.on_event("nope", event)
    with pytest.raises(InvalidRequest):
        reg.on_event("nope", "dance")
    reg.on_event("s", "open")
    reg.on_event("s", "close")
    assert not reg.is_open("s")
