"""A scrape of /metrics checked against SGLang's own metric names, types and labels (taken from
sglang 0.5.23 `srt/observability/metrics_collector.py`) and against the queries of SGLang's Grafana
dashboard (`examples/monitoring/grafana/dashboards/json/sglang-dashboard.json`)."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.slow

SCHED = {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"}  # SchedulerMetricsCollector
TOK = {"model_name", "engine_type"}  # TokenizerMetricsCollector (tokenizer_metric_labels())
STREAM = TOK | {"is_streaming"}

#: family name (as the parser reports it: counters without `_total`) -> (type, label names)
SGLANG = {
    "sglang:num_running_reqs": ("gauge", SCHED),
    "sglang:num_queue_reqs": ("gauge", SCHED),
    "sglang:num_grammar_queue_reqs": ("gauge", SCHED),
    "sglang:gen_throughput": ("gauge", SCHED),
    "sglang:cache_hit_rate": ("gauge", SCHED),
    "sglang:token_usage": ("gauge", SCHED),
    "sglang:full_token_usage": ("gauge", SCHED),
    "sglang:num_used_tokens": ("gauge", SCHED),
    "sglang:kv_available_tokens": ("gauge", SCHED),
    "sglang:kv_evictable_tokens": ("gauge", SCHED),
    "sglang:kv_used_tokens": ("gauge", SCHED),
    "sglang:max_total_num_tokens": ("gauge", SCHED),
    "sglang:page_size": ("gauge", SCHED),
    "sglang:num_pages": ("gauge", SCHED),
    "sglang:context_len": ("gauge", SCHED),
    "sglang:evicted_tokens": ("counter", SCHED),
    "sglang:prompt_tokens": ("counter", STREAM),
    "sglang:generation_tokens": ("counter", STREAM),
    "sglang:cached_tokens": ("counter", TOK | {"cache_source"}),
    "sglang:num_requests": ("counter", STREAM),
    "sglang:num_aborted_requests": ("counter", TOK),
    "sglang:time_to_first_token_seconds": ("histogram", STREAM),
    "sglang:inter_token_latency_seconds": ("histogram", TOK),
    "sglang:request_time_per_output_token_seconds": ("histogram", STREAM),
    "sglang:e2e_request_latency_seconds": ("histogram", STREAM),
    "sglang:prompt_tokens_histogram": ("histogram", TOK),
    "sglang:uncached_prompt_tokens_histogram": ("histogram", TOK),
    "sglang:generation_tokens_histogram": ("histogram", TOK),
}
#: SGLang's default buckets for the latency histograms
TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
E2E_BUCKETS = TTFT_BUCKETS + [600, 1200, 1800, 2400]
#: every series SGLang's Grafana dashboard queries
DASHBOARD = [
    "sglang:e2e_request_latency_seconds_bucket",
    "sglang:e2e_request_latency_seconds_sum",
    "sglang:e2e_request_latency_seconds_count",
    "sglang:time_to_first_token_seconds_bucket",
    "sglang:time_to_first_token_seconds_sum",
    "sglang:time_to_first_token_seconds_count",
    "sglang:num_running_reqs",
    "sglang:gen_throughput",
    "sglang:cache_hit_rate",
    "sglang:num_queue_reqs",
]


def _scrape(url: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)}


def test_metrics_use_sglang_names_types_and_labels(server, engine) -> None:
    prompt = "Metrics scrape: name three colours."
    for stream in (False, True):  # both label values of is_streaming
        body = {"text": prompt, "stream": stream, "sampling_params": {"max_new_tokens": 3, "temperature": 0}}
        assert httpx.post(f"{server.url}/generate", json=body, timeout=120).status_code == 200
    families = _scrape(server.url)
    model = engine.model_info["served_model_name"]
    for name, (kind, labels) in SGLANG.items():
        assert name in families, f"{name} missing"
        family = families[name]
        assert family.type == kind, (name, family.type)
        assert family.samples, name
        for sample in family.samples:
            assert set(sample.labels) - {"le"} == labels, (name, sample.labels)
            assert sample.labels["model_name"] == model
    buckets = {
        float(s.labels["le"])
        for s in families["sglang:time_to_first_token_seconds"].samples
        if s.name.endswith("_bucket") and s.labels["le"] != "+Inf"
    }
    assert sorted(buckets) == TTFT_BUCKETS
    e2e = {
        float(s.labels["le"])
        for s in families["sglang:e2e_request_latency_seconds"].samples
        if s.name.endswith("_bucket") and s.labels["le"] != "+Inf"
    }
    assert sorted(e2e) == E2E_BUCKETS
    series = {s.name for f in families.values() for s in f.samples}
    assert set(DASHBOARD) <= series
    # our own cache figures stay beside them
    assert {"radixagent:cache_hit_rate", "radixagent:pool_capacity_tokens"} <= set(families)


def test_sglang_metrics_values_follow_the_requests(server, engine) -> None:
    def total(families: dict, name: str, **labels: str) -> float:
        return sum(
            s.value
            for s in families[name].samples
            if s.name == name + "_total" and all(s.labels.get(k) == v for k, v in labels.items())
        )

    before = _scrape(server.url)
    prompt = "The quick brown fox jumps over the lazy dog, twice over, for the metrics test."
    body = {"text": prompt, "sampling_params": {"max_new_tokens": 2, "temperature": 0, "ignore_eos": True}}
    first = httpx.post(f"{server.url}/generate", json=body, timeout=120).json()["meta_info"]
    second = httpx.post(f"{server.url}/generate", json=body, timeout=120).json()["meta_info"]
    after = _scrape(server.url)
    grown = total(after, "sglang:prompt_tokens", is_streaming="false") - total(
        before, "sglang:prompt_tokens", is_streaming="false"
    )
    assert grown == first["prompt_tokens"] + second["prompt_tokens"]
    generated = total(after, "sglang:generation_tokens") - total(before, "sglang:generation_tokens")
    assert generated == 4
    cached = total(after, "sglang:cached_tokens", cache_source="device") - total(
        before, "sglang:cached_tokens", cache_source="device"
    )
    assert cached == first["cached_tokens"] + second["cached_tokens"] and second["cached_tokens"] > 0
    # the last admitted prefill batch was `second`: SGLang's per-batch hit rate
    (rate,) = after["sglang:cache_hit_rate"].samples
    assert rate.value == pytest.approx(second["cached_tokens"] / second["prompt_tokens"])
    (capacity,) = after["sglang:max_total_num_tokens"].samples
    assert capacity.value == engine.get_cache_stats()["pool_capacity_tokens"]


def test_server_info_has_sglang_internal_states(server, engine) -> None:
    info = httpx.get(f"{server.url}/get_server_info").json()
    states = info["internal_states"]
    assert isinstance(states, list) and len(states) == 1
    state = states[0]
    assert isinstance(state["last_gen_throughput"], float) and state["last_gen_throughput"] >= 0
    memory = state["memory_usage"]
    assert memory["token_capacity"] == engine.get_cache_stats()["pool_capacity_tokens"]
    assert memory["weight"] > 0.1 and memory["kvcache"] > 0  # GB, as SGLang reports them
    assert state["effective_max_running_requests_per_dp"] == engine.config.max_running_requests
