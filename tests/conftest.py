"""Shared fixtures. The real engine loads once per test session (model load takes ~30 s).

The `slow` marker is kept true here rather than by hand: every test that uses the `engine` fixture
(directly or through another fixture) is marked slow at collection, and a run that deselects slow
tests (`-m "not slow"`) refuses to load the model at all, so a test that loads it some other way
fails with a message instead of quietly making the fast run slow. A test that starts a model
server in a subprocess must carry the marker itself (tests/test_layers.py-style scans cannot see
into a child process).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

#: fixtures that load the real model; a test whose fixture closure holds one is slow
MODEL_FIXTURES = frozenset({"engine"})


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if (
            MODEL_FIXTURES & set(getattr(item, "fixturenames", ()))
            and item.get_closest_marker("slow") is None
        ):
            item.add_marker(pytest.mark.slow)


def pytest_configure(config: pytest.Config) -> None:
    if "not slow" not in (config.option.markexpr or ""):
        return
    from runtime.model import files as model_files

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            "this test loads the model in a `-m 'not slow'` run: mark it @pytest.mark.slow "
            "(or use the `engine` fixture, which marks it)"
        )

    model_files.load = refuse  # type: ignore[assignment]  # the whole not-slow session, on purpose


@pytest.fixture(scope="session")
def engine() -> Iterator[object]:
    """The real embedded engine with a small KV pool, shared by every test that asks for it:
    float32 weights, the configuration whose greedy outputs match HF transformers (the default,
    int4wo-32 on the exact path, has its own engines: tests/runtime/test_exact_fast_path.py)."""
    from runtime import Engine

    eng = Engine(dtype="float32", max_total_tokens=16384)
    yield eng
    eng.shutdown()
