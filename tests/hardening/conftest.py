"""Hardening fixtures: a live server over a small sibling engine (short context, small KV pool) so
that fuzzed prompts stay cheap, with the debug endpoints on."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from runtime.server import ServerArgs, create_app  # noqa: E402
from tests.support.server_util import LiveServer  # noqa: E402

#: the fuzz engine's limits: every prompt longer than CONTEXT - 1 tokens is a 400
CONTEXT = 512
POOL = 2048


@pytest.fixture(scope="module")
def small_engine(engine: object) -> Iterator[object]:
    eng = engine.sibling(max_total_tokens=POOL, context_length=CONTEXT)  # type: ignore[attr-defined]
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def fuzz_server(small_engine: object) -> Iterator[LiveServer]:
    args = ServerArgs(enable_metrics=True, enable_debug_endpoints=True, max_threads=16)
    with nodelay(LiveServer(create_app(small_engine, args))) as live:
        yield live


def nodelay(live: LiveServer) -> LiveServer:
    """TCP_NODELAY on the pre-bound listening socket (accepted sockets inherit it). Without it every
    response whose body is written after its headers waits ~40 ms for a delayed ACK; uvicorn sets
    it itself only on sockets it binds (`radixagent serve` is not affected)."""
    live.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return live


@pytest.fixture(scope="module")
def salted_server(engine: object) -> Iterator[LiveServer]:
    """`--require-cache-salt` over the shared engine (tenant isolation tests)."""
    args = ServerArgs(require_cache_salt=True, enable_debug_endpoints=True)
    with nodelay(LiveServer(create_app(engine, args))) as live:
        yield live
