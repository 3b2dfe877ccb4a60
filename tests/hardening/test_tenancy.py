"""Classes 4, 5 and 7 of issue 17: `--require-cache-salt` means `cache_salt`; namespaces are an
unambiguous digest of (cache_salt, extra_key), bounded and dropped when empty; sessions belong to
the salt that opened them (another tenant's id answers exactly like an unknown one)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from guarded import GuardedServer

from runtime.cache.kv_pool import SlotAllocator
from runtime.cache.namespace import namespace_key, session_key
from runtime.cache.policies import make_policy
from runtime.cache.radix import RadixCache
from runtime.errors import UnknownSession
from runtime.server import ServerArgs
from runtime.server.limits import MAX_SALT_CHARS
from tests.support.server_util import LONG_SYSTEM

# ---- the keys (no model) ---------------------------------------------------------------------


def test_namespace_keys_are_unambiguous() -> None:
    assert namespace_key(None) == namespace_key("") == namespace_key((None, None)) == ""
    assert namespace_key("X") == namespace_key(("X", None))  # the Python API and the server agree
    assert namespace_key(("", "X")) != namespace_key("X")  # extra_key X is not cache_salt X
    assert namespace_key("a|b") != namespace_key(("a", "b"))  # no plain join
    assert namespace_key(("a", "bc")) != namespace_key(("ab", "c"))  # length-prefixed
    assert len(namespace_key("s" * 2**20)) == 32  # a digest, whatever the salt's size
    assert session_key(None, "s") == "s"
    assert session_key("A", "s") != session_key("B", "s") != "s"
    assert session_key(("A", "k1"), "s") == session_key(("A", "k2"), "s")  # sessions belong to the salt


def test_empty_namespaces_leave_no_root() -> None:
    pool = SlotAllocator(64)
    cache = RadixCache(pool, make_policy("lru"))
    for i in range(50):  # lookups in fresh namespaces create nothing
        cache.match_prefix([1, 2, 3], f"ns{i}")
        cache.cached_length([1, 2, 3], f"ns{i}")
        cache.find_node([1, 2, 3], f"ns{i}")
    assert cache.roots == {}
    for ns in ("a", "b"):
        cache.insert([1, 2, 3], pool.alloc(3), ns)
    assert set(cache.roots) == {"a", "b"}
    cache.evict(6)  # evicting a namespace's last node drops its root
    assert cache.roots == {} and pool.available == 64
    cache.check_integrity()


# ---- over HTTP -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def salted(engine: object) -> Iterator[httpx.Client]:
    live = GuardedServer(engine, ServerArgs(require_cache_salt=True))
    with live, httpx.Client(base_url=live.url, timeout=120) as client:
        yield client


def _gen(client: httpx.Client, text: str, **fields: Any) -> httpx.Response:
    body = {"text": text, "sampling_params": {"max_new_tokens": 1, "temperature": 0}, **fields}
    return client.post("/generate", json=body)


def _cached(client: httpx.Client, text: str, **fields: Any) -> int:
    r = _gen(client, text, **fields)
    assert r.status_code == 200, r.text
    return int(r.json()["meta_info"]["cached_tokens"])


@pytest.mark.slow
def test_require_cache_salt_means_cache_salt(salted: httpx.Client) -> None:
    for fields in ({"extra_key": "tenant-a"}, {}, {"cache_salt": ""}, {"cache_salt": "", "extra_key": "k"}):
        r = _gen(salted, "hello", **fields)
        assert r.status_code == 400 and "cache_salt is required" in r.json()["error"]["message"], fields
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "extra_key": "x"}
    assert salted.post("/v1/chat/completions", json=chat).status_code == 400
    assert _gen(salted, "hello", cache_salt="tenant-a", extra_key="k").status_code == 200


@pytest.mark.slow
def test_no_aliasing_between_salt_and_extra_key(salted: httpx.Client) -> None:
    prompt = LONG_SYSTEM + " Question: aliasing?"
    assert _cached(salted, prompt, cache_salt="X") == 0
    assert _cached(salted, prompt, cache_salt="X") > 200  # the owner hits
    assert _cached(salted, prompt, cache_salt="Y", extra_key="X") == 0
    assert _cached(salted, prompt + " 2", cache_salt="a|b") == 0
    assert _cached(salted, prompt + " 2", cache_salt="a", extra_key="b") == 0  # was a hit of 1,620 tokens
    assert _cached(salted, prompt + " 2", cache_salt="a|b") > 200
    assert _cached(salted, prompt + " 3", cache_salt="a", extra_key="b|c") == 0
    assert _cached(salted, prompt + " 3", cache_salt="a|b", extra_key="c") == 0


@pytest.mark.slow
def test_salt_length_is_capped(salted: httpx.Client, engine: Any) -> None:
    for field in ("cache_salt", "extra_key"):
        fields = {"cache_salt": "ok", field: "s" * (MAX_SALT_CHARS + 1)}
        r = _gen(salted, "hello", **fields)
        assert r.status_code == 400 and field in r.json()["error"]["message"], r.text
    assert _gen(salted, "hello", cache_salt="s" * MAX_SALT_CHARS).status_code == 200
    assert all(len(ns) in (0, 32) for ns in engine.cache.roots)  # the tree keeps digests only


@pytest.mark.slow
def test_sessions_belong_to_their_salt(salted: httpx.Client) -> None:
    sid = salted.post("/open_session", json={"cache_salt": "tenant-a"}).json()
    assert _gen(salted, "hi", cache_salt="tenant-a", session_params={"id": sid}).status_code == 200

    def answer(r: httpx.Response, session: str) -> tuple[int, str]:
        return r.status_code, r.json()["error"]["message"].replace(session, "<id>")

    unknown = "0" * len(sid)
    for use in (
        lambda s: _gen(salted, "hi", cache_salt="tenant-b", session_params={"id": s}),
        lambda s: salted.post(
            "/v1/completions",
            json={"prompt": "hi", "max_tokens": 1, "cache_salt": "tenant-b", "session_params": {"id": s}},
        ),
        lambda s: salted.post(
            "/session_event", json={"session_id": s, "event": "tool_wait", "cache_salt": "tenant-b"}
        ),
    ):
        theirs, never = use(sid), use(unknown)
        assert theirs.status_code == 400 and answer(theirs, sid) == answer(never, unknown)
    # /close_session is idempotent (SGLang's contract): another tenant's close is the same no-op
    # 200 as closing an id never opened, and closes nothing (the default namespace is a tenant too)
    for salt in ("tenant-b", None):
        theirs, never = (
            salted.post("/close_session", json={"session_id": s, "cache_salt": salt}) for s in (sid, unknown)
        )
        assert (theirs.status_code, theirs.content) == (never.status_code, never.content) == (200, b"")
    # A's session survived every attempt
    assert _gen(salted, "hi", cache_salt="tenant-a", session_params={"id": sid}).status_code == 200
    assert (
        salted.post("/close_session", json={"session_id": sid, "cache_salt": "tenant-a"}).status_code == 200
    )


@pytest.mark.slow
def test_engine_sessions_are_scoped_by_salt(engine: Any) -> None:
    engine.session_event("scoped-1", "open", cache_salt="A")
    assert engine.session_is_open("scoped-1", "A")
    assert not engine.session_is_open("scoped-1") and not engine.session_is_open("scoped-1", "B")
    for salt in ("B", None):
        with pytest.raises(UnknownSession, match="^session 'scoped-1' is not open$"):
            engine.session_event("scoped-1", "tool_wait", cache_salt=salt, expected_s=1.0)
    engine.session_event("scoped-1", "tool_wait", cache_salt="A", expected_s=1.0)
    engine.session_event("scoped-1", "close", cache_salt="A")
    assert not engine.session_is_open("scoped-1", "A")


def test_agent_session_events_carry_its_salt() -> None:
    """The agent's tool_wait/resume/close must reach the session its salted requests opened."""
    from agent import Agent
    from tests.agent.test_agent_loop import SYSTEM, add, arithmetic_model
    from tests.support.fake_backend import FakeBackend

    backend = FakeBackend(arithmetic_model)
    Agent(backend, system=SYSTEM, tools=[add], session_id="s", cache_salt="tenant").run("What is 1 + 2?")
    assert [info.get("cache_salt") for _, _, info in backend.events] == ["tenant"] * len(backend.events) != []
    unsalted = FakeBackend(arithmetic_model)
    Agent(unsalted, system=SYSTEM, tools=[add], session_id="s").run("What is 1 + 2?")
    assert all("cache_salt" not in info for _, _, info in unsalted.events)
