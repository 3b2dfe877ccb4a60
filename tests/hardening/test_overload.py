"""Class 6 of issue 17: retryable (503) vs not (400). A batch larger than `--max-queue` can never be
served: 400. Generation requests past the worker threads get 503 at once (never an unbounded wait
for a thread), and /health, /get_server_info and /flush_cache answer while every thread is busy."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from guarded import GuardedServer

from runtime.engine.stats import EngineInfo
from runtime.server import ServerArgs
from tests.support.fake_engine import fake_info


class BlockingEngine:
    """Scripted engine (the logic under test is the HTTP layer's): every generate call blocks until
    `release` is set."""

    tokenizer = None

    def info(self) -> EngineInfo:
        return fake_info("blocking", context_length=512, vocab_size=100)

    def __init__(self) -> None:
        self.release = threading.Event()
        self.in_flight = 0
        self.entered = threading.Semaphore(0)
        self._lock = threading.Lock()

    def run(self, requests: list[Any]) -> list[dict[str, Any]]:
        return [self.generate() for _ in requests]

    def generate(self, **kwargs: Any) -> dict[str, Any]:
        with self._lock:
            self.in_flight += 1
        self.entered.release()
        self.release.wait(60)
        with self._lock:
            self.in_flight -= 1
        meta = {
            "id": "r",
            "prompt_tokens": 1,
            "completion_tokens": 1,
            "cached_tokens": 0,
            "finish_reason": {"type": "length", "length": 1},
            "e2e_latency": 0.0,
            "ttft": 0.0,
        }
        return {"text": "x", "output_ids": [1], "meta_info": meta}

    def get_cache_stats(self) -> dict[str, Any]:
        return {"running": self.in_flight, "queue_depth": 0, "tokens_in_use": 0, "pool_capacity_tokens": 1}

    def flush_cache(self) -> bool:
        return self.in_flight == 0


@pytest.fixture
def blocked() -> Iterator[tuple[BlockingEngine, str]]:
    engine = BlockingEngine()
    with GuardedServer(engine, ServerArgs(max_threads=2)) as live:
        yield engine, live.url
        engine.release.set()


GEN = {"text": "hi", "sampling_params": {"max_new_tokens": 1}}


def test_past_the_threads_is_503_at_once_and_control_endpoints_answer(
    blocked: tuple[BlockingEngine, str],
) -> None:
    engine, url = blocked
    results: list[int] = []
    holders = [
        threading.Thread(
            target=lambda: results.append(httpx.post(f"{url}/generate", json=GEN, timeout=60).status_code)
        )
        for _ in range(2)
    ]
    for t in holders:
        t.start()
    for _ in holders:
        assert engine.entered.acquire(timeout=30)
    with httpx.Client(base_url=url, timeout=10) as client:  # a wait for a thread would time out here
        for path, body in (
            ("/generate", GEN),
            ("/v1/completions", {"prompt": "hi", "max_tokens": 1}),
            ("/v1/completions", {"prompt": "hi", "max_tokens": 1, "stream": True}),
        ):
            r = client.post(path, json=body)
            assert r.status_code == 503 and r.json()["error"]["type"] == "overloaded", r.text
            assert "generation threads are busy" in r.json()["error"]["message"]
        assert client.get("/health").status_code == 200
        info = client.get("/get_server_info")
        assert info.status_code == 200 and info.json()["cache_stats"]["running"] == 2
        assert client.post("/flush_cache").status_code == 400  # answered: requests are running
    engine.release.set()
    for t in holders:
        t.join(30)
    assert results == [200, 200]
    assert httpx.post(f"{url}/generate", json=GEN, timeout=30).status_code == 200  # threads came back


@pytest.fixture(scope="module")
def small_queue(engine: Any) -> Iterator[str]:
    eng = engine.sibling(max_queue=4, max_total_tokens=2048, context_length=512)
    with GuardedServer(eng, ServerArgs()) as live:
        yield live.url
    eng.shutdown()


@pytest.mark.slow
def test_batch_larger_than_the_queue_is_a_400(small_queue: str) -> None:
    params = {"max_new_tokens": 1, "temperature": 0}
    cases = [
        ("/generate", {"text": ["a", "b", "c", "d", "e"], "sampling_params": params}),
        ("/generate", {"input_ids": [[1, 2]] * 9, "sampling_params": params}),
        ("/v1/completions", {"prompt": ["a", "b"], "n": 3, "max_tokens": 1}),  # 6 sequences
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "n": 5, "max_tokens": 1}),
    ]
    for path, body in cases:
        r = httpx.post(f"{small_queue}{path}", json=body, timeout=120)
        assert r.status_code == 400, (path, r.text)
        assert "exceeds the queue bound (4, --max-queue)" in r.json()["error"]["message"]
    ok = httpx.post(
        f"{small_queue}/generate", json={"text": ["a", "b", "c", "d"], "sampling_params": params}, timeout=120
    )
    assert ok.status_code == 200 and len(ok.json()) == 4
