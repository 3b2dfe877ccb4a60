"""Shared fixtures. The real engine loads once per test session (model load takes ~30 s)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def engine() -> Iterator[object]:
    """The real embedded engine with a small KV pool, shared by every test that asks for it."""
    from runtime import Engine

    eng = Engine(max_total_tokens=16384)
    yield eng
    eng.shutdown()
