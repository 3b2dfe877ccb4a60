"""Helpers for the server tests: a live uvicorn server in a thread, shared prompts, idle waits."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

API_KEY = "test-key"
# ~250 tokens shared by the cache tests: the second request must hit this prefix
LONG_SYSTEM = "You are a careful assistant for a library. " + " ".join(
    f"Rule {i}: answer briefly and cite shelf {i * 7 % 13}." for i in range(1, 25)
)


class LiveServer:
    def __init__(self, app: object) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Without it each response waits ~40 ms for a delayed ACK on loopback.
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


def wait_idle(engine: object, timeout_s: float = 20.0) -> None:
    """Wait until the engine has nothing running or queued (aborts finish on the scheduler's next step)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = engine.get_cache_stats()  # type: ignore[attr-defined]
        if stats["running"] == 0 and stats["queue_depth"] == 0:
            return
        time.sleep(0.05)
    raise AssertionError(f"engine still busy: {engine.get_cache_stats()}")  # type: ignore[attr-defined]
