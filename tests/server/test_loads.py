"""SGLang's `GET /v1/loads` (what smg's load monitor polls) against the real server, and the older
`GET /get_load` it sits beside."""

from __future__ import annotations

import json
import threading
from datetime import datetime

import httpx

from tests.support.server_util import LONG_SYSTEM, wait_idle

CORE = {
    "timestamp",
    "dp_rank",
    "num_running_reqs",
    "num_waiting_reqs",
    "num_waiting_uncached_tokens",
    "num_used_tokens",
    "num_total_tokens",
    "num_active_tokens",
    "num_prealloc_ready_tokens",
    "max_total_num_tokens",
    "max_running_requests",
    "token_usage",
    "cache_hit_rate",
    "total_prefill_uncached_tokens",
    "decode_moments",
}
# SGLang fields this engine cannot measure: absent rather than a made-up 0
UNMEASURED = {"gen_throughput", "utilization", "total_prefill_busy_us"}


def _loads(server, **params) -> httpx.Response:
    return httpx.get(f"{server.url}/v1/loads", params=params, timeout=30)


def _generate(server, text: str, max_new_tokens: int = 4) -> dict:
    body = {"text": text, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}}
    r = httpx.post(f"{server.url}/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_v1_loads_idle_after_generate(server, engine) -> None:
    _generate(server, LONG_SYSTEM + " loads test")
    wait_idle(engine)
    r = _loads(server)
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"timestamp", "version", "accelerator", "num_accelerators", "loads"}
    assert datetime.fromisoformat(body["timestamp"]).utcoffset().total_seconds() == 0
    assert (body["accelerator"], body["num_accelerators"]) == (None, 0)  # CPU engine
    [load] = body["loads"]
    assert set(load) == CORE | {"memory", "queues"} and not UNMEASURED & set(load)

    stats = engine.get_cache_stats()
    capacity = stats["pool_capacity_tokens"]
    assert load["dp_rank"] == 0 and load["num_running_reqs"] == load["num_waiting_reqs"] == 0
    assert load["max_total_num_tokens"] == capacity == 16384
    assert load["max_running_requests"] == engine.config.max_running_requests
    # idle: the warm cache holds tokens, but they are evictable, so they are not load (as in SGLang)
    assert stats["tokens_in_use"] > 0
    assert load["num_used_tokens"] == capacity - stats["pool_free_tokens"] - engine.cache.evictable_size == 0
    assert load["token_usage"] == 0.0 and load["num_total_tokens"] == load["num_active_tokens"] == 0
    assert load["num_waiting_uncached_tokens"] == 0
    assert abs(load["cache_hit_rate"] - stats["hit_rate"]) < 1e-4
    assert load["total_prefill_uncached_tokens"] == stats["prefill_tokens_computed"] > 0
    assert load["memory"] == {
        "weight_gb": round(engine.model.weight_bytes / 2**30, 3),
        "kv_cache_gb": round(stats["pool_capacity_bytes"] / 2**30, 3),
        "graph_gb": 0.0,
        "token_capacity": capacity,
    }
    assert load["queues"] == {"waiting": 0, "grammar": 0, "paused": 0, "retracted": 0, "prealloc_ready": 0}

    # the older endpoint is unchanged: its num_tokens still counts the whole tree
    [old] = httpx.get(f"{server.url}/get_load").json()
    assert old == {"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": stats["tokens_in_use"]}


def test_v1_loads_counts_a_running_request(server, engine) -> None:
    body = {
        "text": LONG_SYSTEM + " Count slowly from one to a thousand:",
        "sampling_params": {"max_new_tokens": 400, "temperature": 0, "ignore_eos": True},
        "stream": True,
    }
    prompt: list[int] = []
    done = threading.Event()

    def consume() -> None:
        try:
            with httpx.stream("POST", f"{server.url}/generate", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {") and not prompt:
                        prompt.append(json.loads(line[6:])["meta_info"]["prompt_tokens"])
        finally:
            done.set()

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    # poll while the stream runs: one read right after the first chunk can land after a fast CPU
    # finished all 400 tokens, so the test looks for a snapshot taken while it was running
    running = None
    try:
        while not done.is_set() and running is None:
            load = _loads(server).json()["loads"][0]
            if load["num_running_reqs"] == 1 and prompt:
                running = load
    finally:
        reader.join(timeout=120)
        wait_idle(engine, timeout_s=120)
    assert running is not None, "no /v1/loads snapshot saw the streaming request running"
    # the running request pins at least its whole prompt (its cached prefix is locked in the tree)
    assert running["num_used_tokens"] >= prompt[0]
    assert (
        running["token_usage"] == round(running["num_used_tokens"] / running["max_total_num_tokens"], 4) > 0
    )
    assert running["num_total_tokens"] >= running["num_used_tokens"]


def test_v1_loads_include_sections(server) -> None:
    def keys(include: str) -> set[str]:
        r = _loads(server, include=include)
        assert r.status_code == 200, r.text
        return set(r.json()["loads"][0])

    assert keys("core") == CORE
    assert keys("core,memory") == CORE | {"memory"}
    assert keys("queues") == CORE | {"queues"}  # core is always there, as in SGLang
    assert keys("spec,lora,disagg") == CORE  # sections this engine has none of are left out
    assert keys("all") == keys("core, disagg, queues, memory") == CORE | {"memory", "queues"}


def test_v1_loads_rejects_unknown_section_and_format(server) -> None:
    for include in ("bogus", "core,bogus"):
        r = _loads(server, include=include)
        assert r.status_code == 400, r.text
        assert "bogus" in r.json()["error"]["message"]
    r = _loads(server, format="xml")
    assert r.status_code == 400 and "xml" in r.json()["error"]["message"]


def test_v1_loads_dp_rank_filter(server) -> None:
    assert len(_loads(server, dp_rank=0).json()["loads"]) == 1
    assert _loads(server, dp_rank=1).json()["loads"] == []  # one rank here, as SGLang answers out of range


def test_v1_loads_prometheus(server, engine) -> None:
    wait_idle(engine)
    r = _loads(server, format="prometheus")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    lines = r.text.splitlines()
    assert 'sglang_num_running_reqs{dp_rank="0"} 0' in lines
    assert "# TYPE sglang_num_running_reqs gauge" in lines
    assert f'sglang_memory_token_capacity{{dp_rank="0"}} {engine.pool.size}' in lines
    assert 'sglang_queues_waiting{dp_rank="0"} 0' in lines
    assert not any(line.startswith("sglang_decode_moments") for line in lines)  # None: no sample
    core_only = _loads(server, format="prometheus", include="core").text
    assert "sglang_num_used_tokens" in core_only and "sglang_memory_" not in core_only
