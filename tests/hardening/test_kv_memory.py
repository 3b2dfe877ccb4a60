"""The memory claim (issues 17, 18): /get_server_info and /metrics report the K/V bytes actually
held, and with requests reading their K/V in the pool's slots that is the pool, running or idle."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from guarded import GuardedServer

from runtime.server import ServerArgs
from tests.support.server_util import LONG_SYSTEM, wait_idle


@pytest.fixture(scope="module")
def served(engine: Any) -> Iterator[tuple[Any, str]]:
    eng = engine.sibling(max_total_tokens=2048, context_length=1024)
    with GuardedServer(eng, ServerArgs(enable_metrics=True)) as live:
        yield eng, live.url
    eng.shutdown()


def _stats(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/get_server_info", timeout=30).json()["cache_stats"]


@pytest.mark.slow
def test_kv_bytes_held_is_the_pool_while_a_request_runs_and_after(served: tuple[Any, str]) -> None:
    eng, url = served
    body = {
        "text": LONG_SYSTEM,
        "stream": True,
        "sampling_params": {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True},
    }
    with httpx.stream("POST", f"{url}/generate", json=body, timeout=120) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: {"))  # the request is running now
        running = _stats(url)
        assert running["running"] == 1
        assert "kv_request_buffer_bytes" not in running  # requests hold no K/V of their own
        assert running["kv_bytes_held"] == running["pool_capacity_bytes"]
        for line in lines:
            if line.startswith("data: {"):
                json.loads(line[6:])
    wait_idle(eng)
    idle = _stats(url)
    assert idle["kv_bytes_held"] == idle["pool_capacity_bytes"]
    metrics = httpx.get(f"{url}/metrics", timeout=30).text
    held = next(line for line in metrics.splitlines() if line.startswith("radixagent:kv_bytes_held "))
    assert float(held.split()[1]) == idle["kv_bytes_held"]
