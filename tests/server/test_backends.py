"""The three backends give the same greedy answer and cache report through `connect`."""

from __future__ import annotations

import socket

import pytest

from runtime.backends import BACKENDS, connect
from runtime.backends.embedded import EmbeddedBackend
from runtime.backends.openai_compat import OpenAIBackend
from runtime.backends.sglang import SGLangBackend
from runtime.errors import BackendError
from tests.support.server_util import LONG_SYSTEM

GREEDY = {"max_new_tokens": 3, "temperature": 0}


def test_connect_picks_by_target(server, engine) -> None:
    assert set(BACKENDS) == {"embedded", "sglang", "openai"}
    assert isinstance(connect(engine), EmbeddedBackend)
    assert isinstance(connect(server.url), SGLangBackend)
    assert isinstance(connect(f"openai:{server.url}/v1"), OpenAIBackend)
    with pytest.raises(ValueError):
        connect("ftp://nowhere")


def test_same_greedy_output_and_cache_hits(server, engine) -> None:
    backends = [connect(engine), connect(server.url), connect(f"openai:{server.url}")]
    prompt = LONG_SYSTEM + "\nQ: which backend?"
    results = [b.generate(prompt, sampling_params=GREEDY) for b in backends]
    assert len({r.text for r in results}) == 1, [r.text for r in results]
    assert all(r.cached_tokens > 100 for r in results[1:])  # the first call warmed the cache
    assert all(r.prompt_tokens == results[0].prompt_tokens for r in results)
    assert all(0 < r.ttft_s <= r.latency_s for r in results)
    assert results[1].output_ids == results[0].output_ids
    for b in backends:
        b.close()


def test_sglang_backend_extras(server, engine) -> None:
    b = connect(server.url)
    ids = b.tokenize("hello world")
    assert ids == engine.tokenize("hello world") and b.decode(ids) == "hello world"
    out = b.generate(input_ids=ids, sampling_params={**GREEDY, "seed": 3})
    assert out.prompt_tokens == len(ids)
    b.session_event("backend-session", "open")
    b.session_event("backend-session", "tool_wait", expected_s=0.5)
    b.session_event("backend-session", "close")
    assert b.flush_cache() is True
    b.close()


def test_client_errors_raise_at_once(server) -> None:
    b = connect(server.url, max_attempts=5)
    with pytest.raises(BackendError) as info:
        b.generate("x", sampling_params={"max_new_tokens": -1})
    assert info.value.status == 400 and not info.value.retryable and "max_new_tokens" in info.value.message
    o = connect(f"openai:{server.url}", max_attempts=5)
    with pytest.raises(BackendError) as info:
        o.generate("x", sampling_params={"max_new_tokens": 2, "temperature": -1})
    assert info.value.status == 400
    with pytest.raises(BackendError):
        o.generate(input_ids=[1, 2, 3])


def test_connection_refused_retries_then_fails() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    b = connect(f"http://127.0.0.1:{port}", max_attempts=2, retry_backoff_s=0.01)
    with pytest.raises(BackendError) as info:
        b.generate("x", sampling_params=GREEDY)
    assert info.value.retryable and info.value.status is None
