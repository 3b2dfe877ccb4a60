"""Fields OpenAI clients send on chat (and Responses' `reasoning`): what is harmless is accepted,
what this model cannot honour is a 400 naming it (issue 35, 'Also, on the chat door')."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow


def _chat(server: Any, **extra: Any) -> httpx.Response:
    body = {"model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, **extra}
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)


@pytest.mark.parametrize(
    "extra",
    [
        {"store": True},
        {"store": False},
        {"metadata": {"team": "search", "run": "42"}},
        {"service_tier": "auto"},
        {"reasoning_effort": "none"},
        {"reasoning_effort": "minimal"},
    ],
)
def test_harmless_fields_are_accepted(server: Any, extra: dict[str, Any]) -> None:
    r = _chat(server, **extra)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"reasoning_effort": "high"}, "reasoning_effort"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"metadata": {str(i): "x" for i in range(17)}}, "metadata"),
        ({"service_tier": "platinum"}, "service_tier"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_it(server: Any, extra: dict[str, Any], named: str) -> None:
    r = _chat(server, **extra)
    assert r.status_code == 400, r.text
    assert named in r.json()["error"]["message"]


def test_model_default_is_listed_by_name(server: Any) -> None:
    r = httpx.get(f"{server.url}/v1/models/default", timeout=30)
    assert r.status_code == 200 and r.json()["object"] == "model"
    assert httpx.get(f"{server.url}/v1/models/no-such-model", timeout=30).status_code == 404


def test_responses_reasoning_effort_maps_like_chat(server: Any) -> None:
    def create(reasoning: dict[str, Any]) -> httpx.Response:
        body = {"input": "Hi", "max_output_tokens": 2, "reasoning": reasoning}
        return httpx.post(f"{server.url}/v1/responses", json=body, timeout=60)

    assert create({"effort": "none"}).status_code == 200
    high = create({"effort": "high"})
    assert high.status_code == 400 and "reasoning_effort" in high.json()["error"]["message"]
    summary = create({"summary": "auto"})
    assert summary.status_code == 400 and "summary" in summary.json()["error"]["message"]
