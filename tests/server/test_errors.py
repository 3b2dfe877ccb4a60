"""Bad input gets a clear 4xx and never reaches the model; the server stays healthy after."""

from __future__ import annotations

import httpx
import pytest

from tests.support.server_util import API_KEY


def _post(url: str, path: str, **kwargs) -> httpx.Response:
    return httpx.post(url + path, timeout=60, **kwargs)


def _error(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body["error"]) >= {"message", "type"}
    return body["error"]["message"]


@pytest.mark.parametrize(
    ("path", "body", "needle"),
    [
        ("/generate", {"text": 5}, "text"),
        ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
        ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": "4"}}, "max_new_tokens"),
        ("/generate", {"text": "x", "sampling_params": {"temperature": -0.5}}, "temperature"),
        ("/generate", {"text": "x", "sampling_params": {"top_p": 0}}, "top_p"),
        ("/generate", {"text": "x", "sampling_params": {"bogus": 1}}, "bogus"),
        ("/generate", {}, "text"),
        ("/generate", {"text": "x", "stream": "yes"}, "stream"),
        ("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": -3}, "max_tokens"),
        ("/v1/completions", {"model": "m", "prompt": "x", "temperature": "hot"}, "temperature"),
        ("/v1/chat/completions", {"model": "m", "messages": "hi"}, "messages"),
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, "role"),
        ("/session_event", {"session_id": "s", "event": "explode"}, "event"),
    ],
)
def test_validation_is_400_naming_the_field(server, path, body, needle) -> None:
    assert needle in _error(_post(server.url, path, json=body), 400)


def test_malformed_json(server) -> None:
    for path in ("/generate", "/v1/completions", "/v1/chat/completions"):
        r = _post(
            server.url, path, content=b'{"text": "unterminated', headers={"content-type": "application/json"}
        )
        assert "JSON" in _error(r, 400)


def test_engine_rejections_are_400(server, engine) -> None:
    assert "UnknownSession" in _error(
        _post(server.url, "/generate", json={"text": "x", "session_params": {"id": "nope"}}), 400
    )
    # /close_session is idempotent as in SGLang (nothing to close: 200); the event API still refuses
    assert _post(server.url, "/close_session", json={"session_id": "never-opened"}).status_code == 200
    assert "UnknownSession" in _error(
        _post(server.url, "/session_event", json={"session_id": "never-opened", "event": "close"}), 400
    )
    too_long = [1] * (engine.model_info["context_length"] + 10)
    assert "PromptTooLong" in _error(_post(server.url, "/generate", json={"input_ids": too_long}), 400)
    body = {"model": "m", "prompt": too_long}
    assert "PromptTooLong" in _error(_post(server.url, "/v1/completions", json=body), 400)
    stream = {"input_ids": too_long, "stream": True}
    assert "PromptTooLong" in _error(_post(server.url, "/generate", json=stream), 400)


def test_server_healthy_after_bad_input(server) -> None:
    assert httpx.get(f"{server.url}/health").status_code == 200
    r = _post(server.url, "/generate", json={"text": "ok", "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 200


def test_api_key(secured_server) -> None:
    url = secured_server.url
    assert httpx.get(f"{url}/health").status_code == 200  # the one public path
    assert httpx.get(f"{url}/get_model_info").status_code == 401
    bad = {"Authorization": "Bearer wrong"}
    assert _error(httpx.get(f"{url}/v1/models", headers=bad), 401)
    assert (
        _post(url, "/generate", content=b"{oops", headers=bad).status_code == 401
    )  # before the body is read
    good = {"Authorization": f"Bearer {API_KEY}"}
    assert httpx.get(f"{url}/v1/models", headers=good).status_code == 200


def test_require_cache_salt(secured_server) -> None:
    good = {"Authorization": f"Bearer {API_KEY}"}
    body = {"text": "salted", "sampling_params": {"max_new_tokens": 1}}
    assert "cache_salt" in _error(_post(secured_server.url, "/generate", json=body, headers=good), 400)
    r = _post(secured_server.url, "/generate", json={**body, "cache_salt": "tenant-a"}, headers=good)
    assert r.status_code == 200, r.text


def test_oversized_bodies_get_413_declared_or_chunked(engine):
    from runtime.server import ServerArgs, create_app
    from tests.support.server_util import LiveServer

    with LiveServer(create_app(engine, ServerArgs(max_request_bytes=4096))) as live:
        big = {"text": "x" * 5000, "sampling_params": {"max_new_tokens": 1}}
        assert "4096 bytes" in _error(_post(live.url, "/generate", json=big), 413)

        def chunks():
            yield b'{"text": "'
            for _ in range(10):
                yield b"y" * 1000
            yield b'"}'

        r = httpx.post(live.url + "/generate", content=chunks(), headers={"content-type": "application/json"})
        assert "4096 bytes" in _error(r, 413)

        def small():
            yield b'{"text": "Hi", "sampling_params": {"max_new_tokens": 2}}'

        ok = httpx.post(
            live.url + "/generate", content=small(), headers={"content-type": "application/json"}, timeout=60
        )
        assert ok.status_code == 200 and ok.json()["meta_info"]["completion_tokens"] == 2
