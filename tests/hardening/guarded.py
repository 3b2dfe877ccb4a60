"""A live server run the way `radixagent serve` runs it (runtime/server/serving.py: read deadline,
connection limit, JSON protocol errors), and raw-socket helpers for framing tests."""

from __future__ import annotations

import json
import socket
import threading
from typing import Any

import uvicorn

from runtime.server import ServerArgs, create_app  # noqa: E402
from runtime.server.serving import uvicorn_config  # noqa: E402
from tests.support.server_util import LiveServer  # noqa: E402


class GuardedServer(LiveServer):
    def __init__(self, engine: Any, args: ServerArgs) -> None:
        super().__init__(create_app(engine, args))
        config = uvicorn_config(
            self.server.config.app, args, log_level="warning", timeout_graceful_shutdown=2
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)


def connect(port: int, timeout: float = 10.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP response (Content-Length framed, as all of ours are): status, headers, body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response: {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, headers, body[:length]


def error_of(body: bytes) -> dict[str, Any]:
    """The `{"error": {...}}` object; fails unless the body has that shape."""
    error = json.loads(body)["error"]
    assert {"message", "type"} <= set(error), error
    return error


def closed_by_peer(sock: socket.socket) -> bool:
    """True once the server has closed the connection (reads EOF, after any pending response)."""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
