"""`radixagent serve --kv-events-config ... --page-size 4`: a pyzmq subscriber decodes (msgspec) the
events of a real server over the real engine (a sibling of the session's engine: same weights,
its own small pool) and matches them against the prompts' pages as a cache-aware router would."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import requests

from tests.support.server_util import LiveServer

zmq = pytest.importorskip("zmq")
pytest.importorskip("msgspec")

from runtime.cache.kv_events.hashing import prompt_block_hashes  # noqa: E402
from runtime.cache.kv_events.schema import AllBlocksCleared, BlockRemoved, BlockStored, decoder  # noqa: E402
from runtime.server import ServerArgs, create_app  # noqa: E402

PAGE = 4


class Subscriber:
    def __init__(self, endpoint: str, topic: bytes) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic)
        self.sock.connect(endpoint)
        self.decode = decoder()
        self.seen: list = []

    def wait_for(self, predicate, timeout_s: float = 30.0) -> list:
        """Collect events until `predicate(all events so far)` holds."""
        deadline = time.monotonic() + timeout_s
        while not predicate(self.seen):
            assert time.monotonic() < deadline, f"timed out; saw {self.seen}"
            if self.sock.poll(100):
                _, _, payload = self.sock.recv_multipart()
                self.seen.extend(self.decode.decode(payload).events)
        return self.seen

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


@pytest.fixture(scope="module")
def events_server(engine: object) -> Iterator[tuple[str, Subscriber]]:
    config = {"publisher": "zmq", "endpoint": "tcp://127.0.0.1:0", "bind": True, "topic": "kv-events"}
    eng = engine.sibling(  # type: ignore[attr-defined]
        max_total_tokens=192, kv_events_config=json.dumps(config), page_size=PAGE
    )
    try:
        with LiveServer(create_app(eng, ServerArgs())) as live:
            info = requests.get(f"{live.url}/get_server_info", timeout=30).json()["kv_events"]
            assert info["block_size"] == PAGE and info["topic"] == "kv-events" and info["dp_size"] == 1
            sub = Subscriber(f"tcp://127.0.0.1:{info['endpoint_port_base']}", b"kv-events")
            time.sleep(0.3)  # the subscription reaches the publisher
            yield live.url, sub
            sub.close()
    finally:
        eng.shutdown()


def _generate(url: str, ids: list[int], **extra: object) -> dict:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 2, "temperature": 0}, **extra}
    r = requests.post(f"{url}/generate", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def _stored(events: list) -> set[int]:
    return {h for e in events if isinstance(e, BlockStored) for h in e.block_hashes}


def _removed(events: list) -> set[int]:
    return {h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes}


def test_prompt_pages_stored_evicted_flushed_and_salted(events_server) -> None:
    url, sub = events_server
    prompt = [100 + (i * 7) % 300 for i in range(42)]  # 10 whole pages
    pages = prompt_block_hashes(prompt, PAGE)
    _generate(url, prompt, session_id="agent-1")
    sub.wait_for(lambda seen: set(pages) <= _stored(seen))
    first = next(e for e in sub.seen if isinstance(e, BlockStored) and e.block_hashes[0] == pages[0])
    assert first.parent_block_hash is None and first.block_size == PAGE and first.medium == "GPU"
    assert first.token_ids[: len(pages) * PAGE] == prompt[: len(pages) * PAGE]
    assert first.session_id == "agent-1"
    again = _generate(url, prompt)["meta_info"]["cached_tokens"]
    assert again >= len(pages) * PAGE  # what was announced hits

    # a tenant's salt: same tokens, other hashes, the salt named in the event
    salted = prompt_block_hashes(prompt, PAGE, "tenant-a")
    assert not set(salted) & set(pages)
    _generate(url, prompt, cache_salt="tenant-a")
    sub.wait_for(lambda seen: set(salted) <= _stored(seen))
    assert {
        e.cache_salt for e in sub.seen if isinstance(e, BlockStored) and e.block_hashes[0] == salted[0]
    } == {"tenant-a"}

    # the pool (192 tokens) cannot hold three more 42-token prompts besides: evictions follow
    for seed in range(3):
        _generate(url, [400 + seed * 50 + i for i in range(42)])
    sub.wait_for(lambda seen: set(pages) & _removed(seen) or set(salted) & _removed(seen))

    assert requests.post(f"{url}/flush_cache", timeout=60).status_code == 200
    sub.wait_for(lambda seen: isinstance(seen[-1], AllBlocksCleared))
