"""Runaway work: SGLang's /abort_request, non-streaming clients that leave, max_new_tokens past the
context window. Real model, real server on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from runtime.server import ServerArgs, create_app
from tests.support.server_util import LiveServer, wait_idle

pytestmark = pytest.mark.slow

ABORT = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
#: long enough that a request not aborted runs for minutes on this machine
RUNAWAY = {"max_new_tokens": 1500, "temperature": 0, "ignore_eos": True}


def _in_thread(fn: Any, *args: Any, **kwargs: Any) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except Exception as exc:  # reported by the test
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def _wait_decoding(engine: Any, rid: str, timeout_s: float = 60.0) -> None:
    """Until the request `rid` runs and has generated at least one token."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with engine.scheduler.lock:
            if any(r.rid == rid and r.output_ids for r in engine.scheduler.running):
                return
        time.sleep(0.02)
    raise AssertionError(f"request {rid} never started decoding")


def test_abort_request_stops_a_native_request_and_keeps_its_kv(server, engine) -> None:
    rid = f"abort-{uuid.uuid4().hex}"
    prompt_ids = engine.tokenize("Tell me a very long story about a lighthouse keeper.")
    body = {"input_ids": prompt_ids, "rid": rid, "sampling_params": RUNAWAY}
    thread, box = _in_thread(httpx.post, f"{server.url}/generate", json=body, timeout=300)
    _wait_decoding(engine, rid)
    r = httpx.post(f"{server.url}/abort_request", json={"rid": rid})
    assert r.status_code == 200
    thread.join(60)
    assert not thread.is_alive() and "error" not in box, box
    out = box["value"].json()
    assert box["value"].status_code == 200
    meta = out["meta_info"]
    assert meta["finish_reason"] == ABORT
    assert meta["id"] == rid
    assert 1 <= meta["completion_tokens"] < RUNAWAY["max_new_tokens"]
    wait_idle(engine)
    engine.check_integrity()
    # as in SGLang, the aborted request's computed KV (prompt + output so far) went into the tree
    follow = prompt_ids + out["output_ids"][:-1] + [13]
    r = httpx.post(
        f"{server.url}/generate", json={"input_ids": follow, "sampling_params": {"max_new_tokens": 1}}
    )
    assert r.json()["meta_info"]["cached_tokens"] > len(prompt_ids)


def test_abort_request_through_the_openai_client(server, engine) -> None:
    rid = f"oai-{uuid.uuid4().hex}"
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=300)
    thread, box = _in_thread(
        client.chat.completions.create,
        model="m",
        messages=[{"role": "user", "content": "Count from one to a thousand, in words."}],
        max_tokens=1500,
        temperature=0,
        extra_body={"rid": rid, "ignore_eos": True},
    )
    _wait_decoding(engine, rid)
    assert httpx.post(f"{server.url}/abort_request", json={"rid": rid}).status_code == 200
    thread.join(60)
    assert "error" not in box, box
    choice = box["value"].choices[0]
    assert choice.finish_reason == "abort"
    assert box["value"].usage.completion_tokens < 1500
    wait_idle(engine)
    engine.check_integrity()


def test_abort_request_needs_a_rid_and_refuses_unknown_fields(server) -> None:
    r = httpx.post(f"{server.url}/abort_request", json={})
    assert r.status_code == 400 and "rid" in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/abort_request", json={"rid": "x", "abort_message": "late"})
    assert r.status_code == 400 and "abort_message" in r.json()["error"]["message"]
    # an unknown rid is not an error (SGLang answers 200: the request may just have finished)
    assert httpx.post(f"{server.url}/abort_request", json={"rid": "no-such-request"}).status_code == 200


@pytest.fixture(scope="module")
def one_at_a_time(engine: Any) -> Iterator[tuple[LiveServer, Any]]:
    """A server whose engine runs one request at a time, so others wait in its queue."""
    sibling = engine.sibling(max_running_requests=1, max_total_tokens=8192)
    with LiveServer(create_app(sibling, ServerArgs(enable_metrics=True))) as live:
        yield live, sibling
    sibling.shutdown()


def test_abort_all_stops_running_and_queued_requests(one_at_a_time) -> None:
    live, sibling = one_at_a_time
    rids = [f"all-{i}-{uuid.uuid4().hex}" for i in range(3)]
    threads = []
    for i, rid in enumerate(rids):
        body = {"text": f"Story number {i}:", "rid": rid, "sampling_params": RUNAWAY}
        threads.append(_in_thread(httpx.post, f"{live.url}/generate", json=body, timeout=300))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        stats = sibling.get_cache_stats()
        if stats["running"] == 1 and stats["queue_depth"] == 2:
            break
        time.sleep(0.02)
    assert (stats["running"], stats["queue_depth"]) == (1, 2), stats
    assert httpx.post(f"{live.url}/abort_request", json={"abort_all": True}).status_code == 200
    for thread, box in threads:
        thread.join(60)
        assert "error" not in box, box
        assert box["value"].json()["meta_info"]["finish_reason"] == ABORT
    wait_idle(sibling)
    sibling.check_integrity()
    assert sibling.get_cache_stats()["aborted_requests"] >= 3


def _raw_post(port: int, path: str, body: dict) -> socket.socket:
    """Send a request on a socket of our own, so the test can drop the connection mid-flight."""
    payload = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port))
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    sock.sendall(f"{head}Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    return sock


@pytest.mark.parametrize("path", ["/generate", "/v1/completions", "/v1/chat/completions"])
def test_client_leaving_a_non_streaming_request_aborts_it(server, engine, path: str) -> None:
    before = engine.get_cache_stats()["aborted_requests"]
    rid = f"gone-{uuid.uuid4().hex}"
    text = "Write the longest poem you can about the sea."
    oai = {"rid": rid, "max_tokens": 1500, "temperature": 0, "ignore_eos": True}
    bodies = {
        "/generate": {"text": text, "rid": rid, "sampling_params": RUNAWAY},
        "/v1/completions": {"prompt": text, **oai},
        "/v1/chat/completions": {"messages": [{"role": "user", "content": text}], **oai},
    }
    sock = _raw_post(server.port, path, bodies[path])
    _wait_decoding(engine, rid)
    sock.close()  # the client leaves
    wait_idle(engine, timeout_s=30)  # not aborted, 1500 tokens would take minutes
    engine.check_integrity()
    assert engine.get_cache_stats()["aborted_requests"] == before + 1


def test_max_new_tokens_past_the_context_window_is_a_400(server, engine) -> None:
    context = engine.model_info["context_length"]
    r = httpx.post(
        f"{server.url}/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 10**9}}
    )
    assert r.status_code == 400 and "max_new_tokens" in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "hi", "max_tokens": context})
    assert r.status_code == 400 and "max_new_tokens" in r.json()["error"]["message"]
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 10**6},
    )
    assert r.status_code == 400 and "max_new_tokens" in r.json()["error"]["message"]


def test_unset_max_new_tokens_is_clamped_to_the_room_left(engine) -> None:
    """SGLang's split: an explicit limit past the window is refused, the default is clamped."""
    from runtime.errors import PromptTooLong

    small = engine.sibling(context_length=40, max_total_tokens=256)
    try:
        ids = [5] * 36
        out = small.generate(input_ids=ids, sampling_params={"temperature": 0, "ignore_eos": True})
        assert out["meta_info"]["completion_tokens"] == 4
        assert out["meta_info"]["finish_reason"]["type"] == "length"
        exact = small.generate(input_ids=ids, sampling_params={"max_new_tokens": 4, "temperature": 0})
        assert exact["meta_info"]["completion_tokens"] <= 4
        with pytest.raises(PromptTooLong, match="max_new_tokens"):
            small.generate(input_ids=ids, sampling_params={"max_new_tokens": 5})
        small.check_integrity()
    finally:
        small.shutdown()
