"""Tenant isolation: `--require-cache-salt`, no cache hits across salts on every endpoint, the agent
SDK's salt reaching the server, and a timing test (B cannot see A's cache through its own TTFT)."""

from __future__ import annotations

import statistics
from typing import Any

import httpx
import pytest

from evals.hardening.isolation import long_prompt, measure, ttft

CHAT = "/v1/chat/completions"


def _body(path: str, text: str, salt: str | None) -> dict[str, Any]:
    extra = {} if salt is None else {"cache_salt": salt}
    if path == "/generate":
        return {"text": text, "sampling_params": {"max_new_tokens": 1, "temperature": 0}, **extra}
    if path == CHAT:
        return {"messages": [{"role": "user", "content": text}], "max_tokens": 1, "temperature": 0, **extra}
    return {"prompt": text, "max_tokens": 1, "temperature": 0, **extra}


def _cached(body: dict[str, Any]) -> int:
    if "meta_info" in body:
        return int(body["meta_info"]["cached_tokens"])
    return int(body["usage"]["prompt_tokens_details"]["cached_tokens"])


@pytest.mark.parametrize("path", ["/generate", "/v1/completions", CHAT])
def test_salt_is_required_and_isolates(salted_server: Any, path: str) -> None:
    with httpx.Client(base_url=salted_server.url, timeout=120) as c:
        text = long_prompt(f"iso{path}", 120)
        r = c.post(path, json=_body(path, text, None))
        assert r.status_code == 400 and "cache_salt" in r.json()["error"]["message"]
        assert c.post(path, json=_body(path, text, "")).status_code == 400
        first = c.post(path, json=_body(path, text, "tenant-a"))
        assert first.status_code == 200, first.text
        assert _cached(c.post(path, json=_body(path, text, "tenant-a")).json()) > 0  # A's own repeat hits
        other = f"tenant-b{path}"  # a namespace B used for nothing else
        assert _cached(c.post(path, json=_body(path, text, other)).json()) == 0  # B never hits A's
        assert c.get("/debug/integrity").json()["ok"]


def test_agent_sends_its_cache_salt(salted_server: Any) -> None:
    from agent import Agent
    from runtime import connect

    seen: list[str | None] = []

    class Recording:
        """Delegates to the real HTTP backend, recording the salt of every generate call."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def generate(self, *args: Any, **kwargs: Any) -> Any:
            seen.append(kwargs.get("cache_salt"))
            return self.inner.generate(*args, **kwargs)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    backend = Recording(connect(salted_server.url))
    salted = Agent(
        backend=backend, cache_salt="tenant-a", max_steps=1, reflect=False, sampling={"max_new_tokens": 4}
    )
    result = salted.run("Say hi.")
    assert seen and set(seen) == {"tenant-a"}
    assert not any("cache_salt" in str(getattr(s, "error", "") or "") for s in result.steps)
    unsalted = Agent(backend=backend, max_steps=1, reflect=False, sampling={"max_new_tokens": 4})
    result = unsalted.run("Say hi.")
    assert any("cache_salt" in str(getattr(s, "error", "") or "") for s in result.steps)  # the server refused


def test_timing_does_not_reveal_other_tenants_cache(salted_server: Any) -> None:
    """Medians over 10 interleaved samples, generous margins (2 shared CPU cores)."""
    result = measure(salted_server.url, samples=10, words=150)
    assert result.b_on_a_prompt_cached_tokens == 0 and result.a_repeat_cached_tokens > 0
    assert 0.7 <= result.ratio_b_on_a_vs_fresh <= 1.4, result.as_dict()
    assert result.a_speedup >= 3.0, result.as_dict()
    print(
        f"\nisolation: B-on-A/B-fresh median ratio {result.ratio_b_on_a_vs_fresh:.2f}, "
        f"A repeat speedup {result.a_speedup:.1f}x, fresh TTFT {statistics.median(result.b_fresh_ttft_s):.3f}s"
    )


def test_ttft_helper_reports_cached_tokens(salted_server: Any) -> None:
    with httpx.Client(base_url=salted_server.url, timeout=120) as c:
        text = long_prompt("helper", 50)
        assert ttft(c, text, "tenant-h")[1] == 0
        assert ttft(c, text, "tenant-h")[1] > 0
