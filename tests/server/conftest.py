"""A real `radixagent serve` app on 127.0.0.1 (random free port), uvicorn in a background thread,
over the session's shared engine."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from runtime.server import ServerArgs, create_app
from tests.support.server_util import API_KEY, LiveServer


@pytest.fixture(scope="session")
def server(engine: object) -> Iterator[LiveServer]:
    """Open server (no key) with metrics on."""
    with LiveServer(create_app(engine, ServerArgs(enable_metrics=True, max_threads=32))) as live:
        yield live


@pytest.fixture(scope="session")
def secured_server(engine: object) -> Iterator[LiveServer]:
    """Server that requires `Authorization: Bearer test-key` and a cache_salt on generation requests."""
    args = ServerArgs(api_key=API_KEY, require_cache_salt=True)
    with LiveServer(create_app(engine, args)) as live:
        yield live
