"""SGLang-native endpoints over plain HTTP against the real server."""

from __future__ import annotations

import json

import httpx

from tests.support.server_util import LONG_SYSTEM

GREEDY = {"max_new_tokens": 4, "temperature": 0}


def test_generate_single_text(server) -> None:
    r = httpx.post(
        f"{server.url}/generate", json={"text": "The capital of France is", "sampling_params": GREEDY}
    )
    assert r.status_code == 200, r.text
    out = r.json()
    assert (
        isinstance(out["text"], str) and len(out["output_ids"]) == out["meta_info"]["completion_tokens"] <= 4
    )
    meta = out["meta_info"]
    for key in (
        "id",
        "prompt_tokens",
        "completion_tokens",
        "cached_tokens",
        "finish_reason",
        "e2e_latency",
        "ttft",
    ):
        assert key in meta
    assert meta["finish_reason"]["type"] in ("stop", "length")


def test_generate_batch_and_input_ids(server, engine) -> None:
    r = httpx.post(
        f"{server.url}/generate", json={"text": ["One, two,", "Red, green,"], "sampling_params": GREEDY}
    )
    assert r.status_code == 200, r.text
    assert isinstance(r.json(), list) and len(r.json()) == 2
    ids = engine.tokenize("One, two,")
    r2 = httpx.post(f"{server.url}/generate", json={"input_ids": ids, "sampling_params": GREEDY})
    assert r2.status_code == 200, r2.text
    assert r2.json()["output_ids"] == r.json()[0]["output_ids"]
    r3 = httpx.post(f"{server.url}/generate", json={"input_ids": [ids, ids], "sampling_params": GREEDY})
    assert [o["output_ids"] for o in r3.json()] == [r.json()[0]["output_ids"]] * 2


def test_generate_stream_sglang_format(server) -> None:
    body = {"text": "Count: 1, 2, 3,", "sampling_params": GREEDY, "stream": True}
    with httpx.stream("POST", f"{server.url}/generate", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))  # cumulative
    assert chunks[-1]["meta_info"]["finish_reason"] is not None
    once = httpx.post(
        f"{server.url}/generate", json={"text": "Count: 1, 2, 3,", "sampling_params": GREEDY}
    ).json()
    assert chunks[-1]["text"] == once["text"]


def test_generate_reports_cached_tokens(server) -> None:
    def ask(question: str) -> dict:
        body = {
            "text": LONG_SYSTEM + "\nQ: " + question,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0},
        }
        r = httpx.post(f"{server.url}/generate", json=body, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["meta_info"]

    ask("native path, first question?")
    second = ask("native path, second question?")
    assert second["cached_tokens"] > 100


def test_prefix_cache_false_reads_nothing(server) -> None:
    body = {
        "text": LONG_SYSTEM + " no-cache",
        "sampling_params": {"max_new_tokens": 1},
        "prefix_cache": False,
    }
    httpx.post(f"{server.url}/generate", json=body, timeout=60)
    r = httpx.post(f"{server.url}/generate", json=body, timeout=60)
    assert r.json()["meta_info"]["cached_tokens"] == 0


def test_sessions_and_events(server) -> None:
    sid = httpx.post(f"{server.url}/open_session", json={"capacity_of_str_len": 1000}).json()
    assert isinstance(sid, str) and sid
    r = httpx.post(
        f"{server.url}/generate", json={"text": "Hi", "session_id": sid, "sampling_params": GREEDY}
    )
    assert r.status_code == 200, r.text
    r = httpx.post(
        f"{server.url}/session_event", json={"session_id": sid, "event": "tool_wait", "expected_s": 1.5}
    )
    assert r.status_code == 200 and r.json() == {"success": True}
    r = httpx.post(f"{server.url}/session_event", json={"session_id": sid, "event": "resume"})
    assert r.status_code == 200
    assert httpx.post(f"{server.url}/close_session", json={"session_id": sid}).status_code == 200


def test_tokenize_roundtrip(server, engine) -> None:
    r = httpx.post(f"{server.url}/tokenize", json={"prompt": "hello world", "add_special_tokens": False})
    assert r.status_code == 200
    assert r.json()["tokens"] == engine.tokenize("hello world") and r.json()["count"] == len(
        r.json()["tokens"]
    )
    r = httpx.post(f"{server.url}/detokenize", json={"tokens": r.json()["tokens"]})
    assert r.json()["text"] == "hello world"


def test_info_endpoints(server, engine) -> None:
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert httpx.get(f"{server.url}/health_generate", timeout=60).status_code == 200
    info = httpx.get(f"{server.url}/get_model_info").json()
    assert info["model_path"] == engine.model_info["model_path"] and info["is_generation"] is True
    server_info = httpx.get(f"{server.url}/get_server_info").json()
    assert "cache_stats" in server_info and "api_key" not in server_info
    models = httpx.get(f"{server.url}/v1/models").json()
    assert models["data"][0]["id"] == engine.model_info["served_model_name"]


def test_flush_cache_then_miss(server) -> None:
    body = {"text": LONG_SYSTEM + " flush test", "sampling_params": {"max_new_tokens": 1}}
    httpx.post(f"{server.url}/generate", json=body, timeout=60)
    assert httpx.post(f"{server.url}/flush_cache").status_code == 200
    r = httpx.post(f"{server.url}/generate", json=body, timeout=60)
    assert r.json()["meta_info"]["cached_tokens"] == 0


def test_metrics_names(server) -> None:
    httpx.post(f"{server.url}/generate", json={"text": "metrics", "sampling_params": GREEDY})
    text = httpx.get(f"{server.url}/metrics").text
    for name in (
        "radixagent:prompt_tokens_total",
        "radixagent:cached_tokens_total",
        "radixagent:cache_hit_rate",
        "radixagent:evicted_tokens_total",
        "radixagent:evictions_total",
        "radixagent:inserts_total",
        "radixagent:cache_tokens_in_use",
        "radixagent:cache_bytes_in_use",
        "radixagent:pool_capacity_tokens",
        "radixagent:match_time_seconds",
        "radixagent:queue_depth",
        "radixagent:time_to_first_token_seconds_bucket",
    ):
        assert name in text, name
