"""Against a real SGLang 0.5.23 server started by tests/sglang/run.sh (`make test-sglang`) with
`radixagent launch-sglang` (policy `session`, --enable-session-radix-cache, a small
--max-total-tokens). Skipped unless RADIXAGENT_SGLANG_URL is set.

The per-step cached tokens here come from SGLang's own RadixAttention.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

URL = os.environ.get("RADIXAGENT_SGLANG_URL")
pytestmark = pytest.mark.skipif(not URL, reason="RADIXAGENT_SGLANG_URL not set (run `make test-sglang`)")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))  # the behaviour suite module

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


def test_repeated_prefix_reports_cached_tokens() -> None:
    prefix = _text(1, 80)
    first = _gen(prefix)
    second = _gen(prefix + " and then some more words")
    assert second["cached_tokens"] >= first["prompt_tokens"] - 2, (first, second)


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


@pytest.fixture(scope="module")
def sglang_backend():
    from runtime.backends import connect

    backend = connect(URL)
    yield backend
    backend.close()


def _checks():
    from behaviour import ALL_CHECKS

    return ALL_CHECKS


@pytest.mark.parametrize("check", _checks(), ids=lambda c: c.__name__)
def test_behaviour_suite_on_real_sglang(check, sglang_backend) -> None:
    check(sglang_backend)
