"""Classes 2, 5 and 8 of issue 17 at the connection level, over raw sockets against a server run as
`radixagent serve` runs it: the body limit counts bytes received whatever the framing headers say,
auth comes before the body, two Authorization headers are refused, stalled requests time out, the
connection count is bounded, and protocol errors have the JSON error shape."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest
from guarded import GuardedServer, closed_by_peer, connect, error_of, read_response

from runtime.server import ServerArgs

KEY = "framing-key"
LIMIT = 64 * 1024
GEN = json.dumps({"text": "Hi", "sampling_params": {"max_new_tokens": 1, "temperature": 0}}).encode()


@pytest.fixture(scope="module")
def server(small_engine: object) -> Iterator[GuardedServer]:
    args = ServerArgs(api_key=KEY, max_request_bytes=LIMIT, timeout_read=1.5, limit_concurrency=24)
    with GuardedServer(small_engine, args) as live:
        yield live


def _head(path: str, *lines: str, auth: bool = True) -> bytes:
    fields = [f"POST {path} HTTP/1.1", "Host: x", "Content-Type: application/json", *lines]
    if auth:
        fields.append(f"Authorization: Bearer {KEY}")
    return ("\r\n".join(fields) + "\r\n\r\n").encode()


def _chunked(body: bytes, size: int = 16 * 1024) -> bytes:
    parts = [
        b"%x\r\n%s\r\n" % (len(body[i : i + size]), body[i : i + size]) for i in range(0, len(body), size)
    ]
    return b"".join(parts) + b"0\r\n\r\n"


def _json_with_padding(n: int) -> bytes:
    return json.dumps({"text": "Hi", "pad": "x" * n, "sampling_params": {"max_new_tokens": 1}}).encode()


@pytest.mark.slow
def test_content_length_with_chunked_is_refused(server: GuardedServer) -> None:
    big = _json_with_padding(4 * LIMIT)  # the issue sent 40 MiB behind "Content-Length: 10"
    for declared in ("10", str(len(big))):
        with connect(server.port) as sock:
            sock.sendall(_head("/generate", f"Content-Length: {declared}", "Transfer-Encoding: chunked"))
            sock.sendall(_chunked(big))
            status, headers, body = read_response(sock)
            assert status == 400 and "Transfer-Encoding" in error_of(body)["message"]
            assert headers.get("connection") == "close"


@pytest.mark.slow
def test_body_limit_counts_bytes_received(server: GuardedServer) -> None:
    over = _json_with_padding(LIMIT)
    with connect(server.port) as sock:  # chunked, no length declared
        sock.sendall(_head("/generate", "Transfer-Encoding: chunked") + _chunked(over))
        status, _, body = read_response(sock)
        assert status == 413 and "--max-request-bytes" in error_of(body)["message"]
    with connect(server.port) as sock:  # declared honestly: refused before reading
        sock.sendall(_head("/generate", f"Content-Length: {len(over)}"))
        assert read_response(sock)[0] == 413
    with connect(server.port) as sock:  # two lengths
        sock.sendall(_head("/generate", "Content-Length: 5", "Content-Length: 5") + b"{}{}{")
        status, _, body = read_response(sock)
        assert status == 400 and error_of(body)
    with connect(server.port) as sock:  # under the limit, chunked: served
        sock.sendall(_head("/generate", "Transfer-Encoding: chunked") + _chunked(GEN, 7))
        assert read_response(sock)[0] == 200


@pytest.mark.slow
def test_auth_is_checked_before_the_body_is_read(server: GuardedServer) -> None:
    for framing in ("Transfer-Encoding: chunked", "Content-Length: 1000000"):
        with connect(server.port, timeout=5) as sock:
            sock.sendall(_head("/generate", framing, auth=False))  # headers only: no body byte follows
            status, _, body = read_response(sock)  # answered without waiting for the body
            assert status == 401 and error_of(body)["type"] == "authentication_error"


@pytest.mark.slow
def test_two_authorization_headers_are_refused(server: GuardedServer) -> None:
    body = b"Content-Length: %d" % len(GEN)
    pairs = [(KEY, KEY), ("wrong", KEY), (KEY, "wrong")]
    for first, second in pairs:
        with connect(server.port) as sock:
            sock.sendall(
                _head("/generate", body.decode(), f"Authorization: Bearer {first}", auth=False)[:-2]
                + f"Authorization: Bearer {second}\r\n\r\n".encode()
                + GEN
            )
            assert read_response(sock)[0] == 401, (first, second)
    r = httpx.get(f"{server.url}/get_model_info", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200  # one header with the key still works


@pytest.mark.slow
def test_stalled_requests_time_out(server: GuardedServer) -> None:
    with connect(server.port, timeout=15) as sock:  # headers never finished
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-")
        status, headers, body = read_response(sock)
        assert status == 408 and "--timeout-read" in error_of(body)["message"]
        assert closed_by_peer(sock)
    with connect(server.port, timeout=15) as sock:  # body never finished
        sock.sendall(_head("/generate", f"Content-Length: {len(GEN)}") + GEN[:5])
        assert closed_by_peer(sock)
    with connect(server.port, timeout=15) as sock:  # nothing sent at all
        assert closed_by_peer(sock)
    with connect(server.port, timeout=15) as sock:  # a slow but steady request is not cut
        sock.sendall(_head("/generate", f"Content-Length: {len(GEN)}"))
        time.sleep(0.5)
        sock.sendall(GEN)
        assert read_response(sock)[0] == 200


@pytest.mark.slow
def test_connection_limit(server: GuardedServer) -> None:
    held = [connect(server.port) for _ in range(24)]
    try:
        time.sleep(0.2)
        with connect(server.port) as extra:
            status, headers, body = read_response(extra)
            assert status == 503 and "too many connections" in error_of(body)["message"]
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.3)
    assert httpx.get(f"{server.url}/health").status_code == 200


@pytest.mark.slow
def test_protocol_errors_are_json(server: GuardedServer) -> None:
    for raw in (
        b"GARBAGE\r\n\r\n",
        b"POST /generate HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
        b"POST /generate HTTP/1.1\r\nContent-Length: x\r\n\r\n",
    ):
        with connect(server.port) as sock:
            sock.sendall(raw)
            status, headers, body = read_response(sock)
            assert status == 400 and headers["content-type"] == "application/json", raw
            assert "malformed HTTP request" in error_of(body)["message"]


@pytest.mark.slow
def test_wrong_methods_and_paths_name_themselves(server: GuardedServer) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    for path in ("/open_session", "/close_session", "/generate"):
        r = httpx.get(f"{server.url}{path}", headers=auth)
        assert r.status_code == 405 and "POST" in r.headers["allow"], path
        message = r.json()["error"]["message"]
        assert f"GET is not allowed on {path}" in message and "POST" in message
    r = httpx.get(f"{server.url}/nope", headers=auth)
    assert r.status_code == 404 and "/nope" in r.json()["error"]["message"]
