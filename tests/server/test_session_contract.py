"""SGLang's session contract (`--enable-session-radix-cache`) on our server: a top-level
`session_id` on every generation route opens and references its session, `/close_session` is
idempotent and turns the session's KV into the first to go, and the session gauges count it.
The eviction case mirrors tests/sglang/test_real_sglang.py's, which runs it against SGLang."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from runtime.server import ServerArgs, create_app
from tests.support.server_util import LiveServer

WORDS = ("alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta")
GREEDY = {"max_new_tokens": 2, "temperature": 0}


def _text(seed: int, words: int = 40) -> str:
    return " ".join(f"{WORDS[(seed * 7 + i * 3) % len(WORDS)]}{seed}" for i in range(words))


@pytest.fixture(scope="module")
def session_server(engine: object) -> Iterator[tuple[str, object]]:
    eng = engine.sibling(max_total_tokens=560, radix_eviction_policy="session")  # type: ignore[attr-defined]
    try:
        with LiveServer(create_app(eng, ServerArgs(enable_metrics=True))) as live:
            yield live.url, eng
    finally:
        eng.shutdown()


def _gen(url: str, text: str, session_id: str | None = None) -> dict:
    body: dict = {"text": text, "sampling_params": GREEDY}
    if session_id is not None:
        body["session_id"] = session_id
    r = httpx.post(f"{url}/generate", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["meta_info"]


def _gauge(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith(f"radixagent:{name} "):
            return float(line.split()[1])
    raise AssertionError(f"no radixagent:{name}")


def test_top_level_session_id_on_every_route_opens_and_close_is_idempotent(session_server) -> None:
    url, eng = session_server
    before = _gauge(url, "sessions_open")
    _gen(url, "Hello there", session_id="c-gen")
    r = httpx.post(
        f"{url}/v1/completions",
        json={"model": "m", "prompt": "Hello", "max_tokens": 1, "session_id": "c-cmp"},
        timeout=300,
    )
    assert r.status_code == 200, r.text
    chat = {
        "model": "m",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 1,
        "session_id": "c-chat",
    }
    assert httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=300).status_code == 200
    assert all(eng.session_is_open(s) for s in ("c-gen", "c-cmp", "c-chat"))  # type: ignore[attr-defined]
    assert _gauge(url, "sessions_open") == before + 3
    httpx.post(f"{url}/session_event", json={"session_id": "c-gen", "event": "tool_wait"}, timeout=30)
    assert _gauge(url, "sessions_waiting_on_tool") == 1
    for sid in ("c-gen", "c-cmp", "c-chat", "c-gen", "never-used"):  # twice, and one never opened
        assert httpx.post(f"{url}/close_session", json={"session_id": sid}, timeout=30).status_code == 200
    assert _gauge(url, "sessions_open") == before and _gauge(url, "sessions_waiting_on_tool") == 0
    _gen(url, "Hello there again", session_id="c-gen")  # a later request reopens it
    assert eng.session_is_open("c-gen")  # type: ignore[attr-defined]
    httpx.post(f"{url}/close_session", json={"session_id": "c-gen"}, timeout=30)


def test_closed_session_goes_first(session_server) -> None:
    """Pool 560 < the five ~127-token prompts: about one prompt must go, and it is the closed
    session's, although the open session's prompt is older (LRU would take that one)."""
    url, _ = session_server
    live, closed = _text(11), _text(12)
    a = _gen(url, live, session_id="live-a")
    _gen(url, closed, session_id="closed-b")
    httpx.post(f"{url}/close_session", json={"session_id": "closed-b"}, timeout=30)
    for seed in (13, 14, 15):
        _gen(url, _text(seed))
    again_live = _gen(url, live + " next", session_id="live-a")
    again_closed = _gen(url, closed + " next")
    assert again_live["cached_tokens"] >= a["prompt_tokens"] - 2, again_live
    assert again_closed["cached_tokens"] < again_closed["prompt_tokens"] // 2, again_closed
    httpx.post(f"{url}/close_session", json={"session_id": "live-a"}, timeout=30)
