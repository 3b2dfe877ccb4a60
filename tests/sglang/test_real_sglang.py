"""Against a real SGLang 0.5.23 server started by tests/sglang/run.sh (`make test-sglang`) with
`radixagent launch-sglang` (policy `session`, a small --max-total-tokens), in the configuration
RADIXAGENT_SGLANG_MODE names (with or without --enable-session-radix-cache, Rust core forced or
not; run.sh checks the refusal itself). Skipped unless RADIXAGENT_SGLANG_URL is set.

The per-step cached tokens here come from SGLang's own RadixAttention.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

URL = os.environ.get("RADIXAGENT_SGLANG_URL")
#: which configuration tests/sglang/run.sh started (session-cache, plain, rust-session) and its log
MODE = os.environ.get("RADIXAGENT_SGLANG_MODE", "session-cache")
LOG = os.environ.get("RADIXAGENT_SGLANG_LOG")
SESSION_CACHE = MODE in ("session-cache", "rust-session")
pytestmark = pytest.mark.skipif(not URL, reason="RADIXAGENT_SGLANG_URL not set (run `make test-sglang`)")

WORDS = ("alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta")


def _text(seed: int, words: int = 100) -> str:  # ~310 tokens
    return " ".join(f"{WORDS[(seed * 7 + i * 3) % len(WORDS)]}{seed}" for i in range(words))


def _post(path: str, body: dict) -> dict:
    import requests

    r = requests.post(f"{URL}{path}", json=body, timeout=300)
    r.raise_for_status()
    return r.json() if r.content else {}


def _gen(text: str, session_id: str | None = None) -> dict:
    body = {"text": text, "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    if session_id is not None:
        body["session_id"] = session_id
    return _post("/generate", body)["meta_info"]


def test_serves_with_session_policy() -> None:
    import requests

    info = requests.get(f"{URL}/get_server_info", timeout=30).json()
    assert info["radix_eviction_policy"] == "session"
    out = _post(
        "/generate",
        {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 4, "temperature": 0}},
    )
    assert out["text"] and out["meta_info"]["completion_tokens"] >= 1


@pytest.mark.skipif(not LOG, reason="RADIXAGENT_SGLANG_LOG not set")
def test_policy_in_force_on_the_python_tree_core() -> None:
    """The plugin's start-up line: the session policy runs, on SGLang's Python core (with the Rust
    core forced and the session radix cache on, SGLang's own fallback is logged too)."""
    text = Path(str(LOG)).read_text(errors="replace")
    assert "eviction policy session in force on SGLang's Python UnifiedTreeCore" in text
    if MODE == "rust-session":
        assert "Using the Python TreeCore: session-aware caching requires the Python TreeCore" in text


def test_repeated_prefix_reports_cached_tokens() -> None:
    prefix = _text(1, 80)
    first = _gen(prefix)
    second = _gen(prefix + " and then some more words")
    assert second["cached_tokens"] >= first["prompt_tokens"] - 2, (first, second)


@pytest.mark.skipif(not SESSION_CACHE, reason="needs --enable-session-radix-cache (session facts)")
def test_evicts_under_small_budget_closed_session_first() -> None:
    """Pool (--max-total-tokens 1024) < the five ~310-token prompts: something must go. The
    closed session's and the session-less prompts go; the open session's prefix still hits."""
    live, closed = _text(11), _text(12)
    a = _gen(live, session_id="live-a")
    _gen(closed, session_id="closed-b")
    _post("/close_session", {"session_id": "closed-b"})
    for seed in (13, 14, 15):
        _gen(_text(seed))
    again_live = _gen(live + " next", session_id="live-a")
    again_closed = _gen(closed + " next")
    assert again_live["cached_tokens"] >= a["prompt_tokens"] - 2, again_live
    assert again_closed["cached_tokens"] < again_closed["prompt_tokens"] // 2, again_closed
    _post("/close_session", {"session_id": "live-a"})


@pytest.mark.skipif(MODE != "plain", reason="the order without session facts")
def test_without_session_cache_policy_orders_by_recency() -> None:
    """Without --enable-session-radix-cache SGLang's nodes carry no session references, so the
    policy is recency on SGLang's counter clock: of five ~310-token prompts in a 1,024-token pool
    the oldest go and the newest stays, session ids or not."""
    first = _gen(_text(21), session_id="ignored-a")
    for seed in (22, 23, 24):
        _gen(_text(seed))
    last = _gen(_text(25))
    assert _gen(_text(25) + " next")["cached_tokens"] >= last["prompt_tokens"] - 2
    again_first = _gen(_text(21) + " next")
    assert again_first["cached_tokens"] < first["prompt_tokens"] // 2, again_first


@pytest.fixture(scope="module")
def sglang_backend():
    from runtime.backends import connect

    backend = connect(URL)
    yield backend
    backend.close()


def _checks():
    from tests.support.behaviour import ALL_CHECKS

    return ALL_CHECKS


@pytest.mark.skipif(MODE != "session-cache", reason="the suite runs once, in the session-cache configuration")
@pytest.mark.parametrize("check", _checks(), ids=lambda c: c.__name__)
def test_behaviour_suite_on_real_sglang(check, sglang_backend) -> None:
    check(sglang_backend)
