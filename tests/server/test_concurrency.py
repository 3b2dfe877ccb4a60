"""Many clients at once, and clients that leave mid-stream: all answered, locks released."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.support.server_util import wait_idle


def test_sixteen_concurrent_clients(server, engine) -> None:
    def one(i: int) -> tuple[int, dict]:
        body = {
            "text": f"Client {i} says hello to",
            "sampling_params": {"max_new_tokens": 3, "temperature": 0},
        }
        if i % 4 == 3:
            r = httpx.post(
                f"{server.url}/v1/completions",
                json={"model": "m", "prompt": body["text"], "max_tokens": 3},
                timeout=120,
            )
            return r.status_code, r.json()
        r = httpx.post(f"{server.url}/generate", json=body, timeout=120)
        return r.status_code, r.json()

    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(one, range(16)))
    assert [status for status, _ in results] == [200] * 16, results
    wait_idle(engine)
    engine.check_integrity()


def test_client_disconnect_mid_stream_releases_locks(server, engine) -> None:
    body = {
        "text": "Write a very long story about a dragon.",
        "stream": True,
        "sampling_params": {"max_new_tokens": 200, "temperature": 0, "ignore_eos": True},
    }
    with httpx.stream("POST", f"{server.url}/generate", json=body, timeout=60) as r:
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data:"))
        assert json.loads(first[5:])["meta_info"]["completion_tokens"] >= 1
    # connection closed after one chunk: the engine stream is closed, the request aborted
    wait_idle(engine)
    engine.check_integrity()
    stats = engine.get_cache_stats()
    assert stats["running"] == 0
    r = httpx.post(
        f"{server.url}/generate", json={"text": "still alive?", "sampling_params": {"max_new_tokens": 1}}
    )
    assert r.status_code == 200
