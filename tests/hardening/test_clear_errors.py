"""Classes 3 and 8 of issue 17: every client mistake is a 4xx whose message names the field or the
problem (never a 500, never "There was an error parsing the body"), and the keep-alive connection
survives it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from guarded import GuardedServer, connect, read_response

from runtime.server import ServerArgs
from runtime.server.limits import MAX_JSON_DEPTH, check_nesting

CHAT = "/v1/chat/completions"


def deep(n: int, leaf: Any = "x") -> Any:
    value = leaf
    for _ in range(n):
        value = {"a": value}
    return value


def test_nesting_check_names_the_field() -> None:
    check_nesting(deep(MAX_JSON_DEPTH - 1))
    with pytest.raises(ValueError, match=r"messages\.0\.tool_calls\.0\. \.\.\.: nested deeper than 64"):
        check_nesting({"messages": [{"tool_calls": [deep(200)]}]})
    with pytest.raises(ValueError, match="nested deeper"):
        check_nesting([[[[[[[[1]]]]]]]], limit=5)
    check_nesting(deep(10_000), limit=20_000)  # iterative: no RecursionError of its own


@pytest.fixture(scope="module")
def server(small_engine: object) -> Iterator[GuardedServer]:
    with GuardedServer(small_engine, ServerArgs()) as live:
        yield live


@pytest.fixture(scope="module")
def client(server: GuardedServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


def _message(client: httpx.Client, path: str, body: Any = None, raw: bytes | None = None) -> str:
    content = raw if raw is not None else json.dumps(body).encode()
    r = client.post(path, content=content, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500, (path, r.status_code, r.text[:300])
    assert r.headers.get("connection") != "close", r.headers
    error = r.json()["error"]
    assert {"message", "type"} <= set(error)
    assert error["message"] != "There was an error parsing the body"
    return str(error["message"])


def _chat(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"messages": list(messages), "max_tokens": 1, **extra}


@pytest.mark.slow
def test_deep_nesting_in_messages_is_a_400(client: httpx.Client) -> None:
    user = {"role": "user", "content": "hi"}
    cases = [  # the examples (~900 deep), then variants
        _chat({**user, "extra": deep(900)}),
        _chat({"role": "assistant", "content": "", "tool_calls": [deep(900)]}, user),
        _chat({"role": "user", "content": [deep(300)]}),
        _chat(user, tools=[{"type": "function", "function": deep(500)}]),
        _chat(user, chat_template_kwargs=deep(100)),
        _chat(user, session_params=deep(100)),
    ]
    for body in cases:
        assert "nested deeper than 64 levels" in _message(client, CHAT, body)
    generate = {"text": "hi", "session_params": deep(200), "sampling_params": {"max_new_tokens": 1}}
    assert "session_params" in _message(client, "/generate", generate)
    assert "nested too deeply" in _message(client, CHAT, raw=b"[" * 100_000 + b"]" * 100_000)
    schema: dict = {"type": "string"}
    for _ in range(12):  # a legitimately nested schema: ~30 levels of request JSON
        schema = {"type": "object", "properties": {"a": schema}}
    ok = _chat(user, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert client.post(CHAT, json=ok).status_code == 200  # moderate nesting is served


@pytest.mark.slow
def test_keep_alive_survives_client_mistakes(server: GuardedServer) -> None:
    bad = json.dumps(_chat({"role": "user", "content": "hi", "extra": deep(900)})).encode()
    fmt = json.dumps(
        _chat({"role": "user", "content": "hi"}, response_format={"type": "json_schema"})
    ).encode()
    good = json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 1}}).encode()
    with connect(server.port) as sock:  # one connection, four requests
        for path, body, status in (
            (CHAT, bad, 400),
            (CHAT, fmt, 400),
            ("/generate", b"{", 400),
            ("/generate", good, 200),
        ):
            head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
            got, headers, _ = read_response(sock)
            assert got == status and headers.get("connection") != "close", (path, got, headers)


@pytest.mark.slow
def test_huge_integers_and_overflowing_numbers(client: httpx.Client) -> None:
    huge = "9" * 5000
    raws = [
        ("/generate", f'{{"text": "hi", "sampling_params": {{"max_new_tokens": {huge}}}}}'),
        ("/generate", f'{{"input_ids": [{huge}]}}'),
        (CHAT, f'{{"messages": [{{"role": "user", "content": "hi"}}], "seed": -{huge}}}'),
        ("/tokenize", f'{{"prompt": "hi", "x": {huge}}}'),
    ]
    for path, raw in raws:
        assert "more than 4300 digits" in _message(client, path, raw=raw.encode())
    for path, raw, field in (
        (
            "/generate",
            '{"text": "hi", "sampling_params": {"temperature": 1e400}}',
            "sampling_params.temperature",
        ),
        ("/generate", '{"text": "hi", "sampling_params": {"max_new_tokens": 1e400}}', "max_new_tokens"),
        (CHAT, '{"messages": [{"role": "user", "content": "hi"}], "top_p": -1e400}', "top_p"),
        ("/session_event", '{"session_id": "s", "event": "tool_wait", "expected_s": 1e400}', "expected_s"),
    ):
        message = _message(client, path, raw=raw.encode())
        assert field in message and "finite number" in message, message


@pytest.mark.slow
def test_body_encoding_errors(client: httpx.Client) -> None:
    assert "not valid UTF-8" in _message(client, "/generate", raw=b'{"text": "\xff\xfe"}')
    assert "malformed JSON body" in _message(client, "/generate", raw=b'{"text": "hi"')
    assert "JSON object" in _message(client, "/generate", raw=b"[1, 2]")
