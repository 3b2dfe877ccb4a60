"""Prometheus metrics, one `CollectorRegistry` per app, no global state: SGLang's `sglang:*` families
with its `model_name` label (runtime/server/sglang_metrics.py) and our `radixagent:*` cache figures.

Cache metrics are read from `engine.get_cache_stats()` at scrape time (the engine keeps the
counters); request latencies are observed by the server as responses finish.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from runtime.server.sglang_metrics import SGLangRequestMetrics, SGLangSchedulerCollector

if TYPE_CHECKING:
    from runtime.engine.engine import Engine

P = "radixagent:"

# (stats key, metric name without prefix/_total, help)
_COUNTERS = (
    ("requests", "engine_requests", "Requests the engine finished."),
    ("prompt_tokens", "prompt_tokens", "Prompt tokens received."),
    ("cached_tokens", "cached_tokens", "Prompt tokens served from the prefix cache."),
    ("inserts", "inserts", "Insertions into the radix tree."),
    ("evictions", "evictions", "Nodes evicted from the radix tree."),
    ("evicted_tokens", "evicted_tokens", "Tokens evicted from the radix tree."),
    # the KV tier (--enable-hierarchical-cache), present only when it is on
    ("tier_hits", "tier_hits", "Requests that loaded prefix pages from the KV tier."),
    ("tier_loaded_tokens", "tier_loaded_tokens", "Tokens loaded from the KV tier instead of recomputed."),
    ("tier_demoted_tokens", "tier_demoted_tokens", "Tokens written to the KV tier."),
    ("tier_bytes_read", "tier_bytes_read", "Bytes read from the KV tier's store."),
    ("tier_bytes_written", "tier_bytes_written", "Bytes written to the KV tier's store."),
    ("tier_load_time_s", "tier_load_seconds", "Seconds spent loading pages from the KV tier."),
    ("tier_write_time_s", "tier_write_seconds", "Engine-thread seconds demoting pages to the KV tier."),
    ("tier_corrupt_pages", "tier_corrupt_pages", "Stored pages rejected by verification (recomputed)."),
    ("tier_prefetched_tokens", "tier_prefetched_tokens", "Tokens prefetched for sessions waiting on tools."),
    ("tier_dropped_pages", "tier_dropped_pages", "Evicted pages not demoted: the write queue was full."),
    # KV events (--kv-events-config), present only when publishing
    ("kv_events_recorded", "kv_events_recorded", "Tree changes queued for the KV-event publisher."),
    ("kv_events_dropped", "kv_events_dropped", "Tree changes not published: the event queue was full."),
    ("kv_events_batches", "kv_events_batches", "KV-event batches sent."),
)
_GAUGES = (
    ("hit_rate", "cache_hit_rate", "cached_tokens / prompt_tokens since start."),
    ("tokens_in_use", "cache_tokens_in_use", "KV pool tokens held by the cache and running requests."),
    ("bytes_in_use", "cache_bytes_in_use", "KV pool bytes held."),
    ("pool_capacity_tokens", "pool_capacity_tokens", "KV pool capacity in tokens."),
    ("pool_capacity_bytes", "pool_capacity_bytes", "KV pool capacity in bytes."),
    (
        "kv_bytes_held",
        "kv_bytes_held",
        "K/V bytes held: the pool (running requests read and write their K/V in it).",
    ),
    (
        "kv_bytes_per_token",
        "kv_bytes_per_token",
        "KV pool bytes per cached token (follows --kv-cache-dtype).",
    ),
    (
        "tier_write_queue_bytes",
        "tier_write_queue_bytes",
        "Bytes of evicted pages queued for the KV tier's background writer (outside the pool).",
    ),
    ("match_time_mean_s", "match_time_seconds", "Mean radix-tree prefix match time."),
    ("queue_depth", "queue_depth", "Requests waiting in the engine queue."),
    ("running", "num_running_reqs", "Requests being decoded."),
    ("sessions_open", "sessions_open", "Agent sessions open (top-level session_id, /open_session)."),
    ("sessions_waiting_on_tool", "sessions_waiting_on_tool", "Open sessions waiting on a tool."),
)
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class EngineStatsCollector(Collector):
    """Turns one `get_cache_stats()` snapshot into Prometheus families."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        stats = self.engine.get_cache_stats()
        for key, name, doc in _COUNTERS:
            if key in stats:
                yield CounterMetricFamily(P + name, doc, value=float(stats[key] or 0))
        for key, name, doc in _GAUGES:
            if key in stats:
                yield GaugeMetricFamily(P + name, doc, value=float(stats[key] or 0))
        if "kv_cache_dtype" in stats:
            info = GaugeMetricFamily(
                P + "kv_cache_dtype_info", "How K/V is stored.", labels=["kv_cache_dtype"]
            )
            info.add_metric([str(stats["kv_cache_dtype"])], 1.0)
            yield info


class ServerMetrics:
    """The app's registry: engine stats plus per-request latencies seen by the HTTP layer."""

    def __init__(self, engine: Engine, model_name: str = "default") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(EngineStatsCollector(engine))
        self.registry.register(SGLangSchedulerCollector(engine, model_name))
        self.sglang = SGLangRequestMetrics(self.registry, model_name)
        self.http_requests = Counter(
            P + "http_requests",
            "Generation requests answered, by endpoint.",
            ["endpoint"],
            registry=self.registry,
        )
        self.ttft = Histogram(
            P + "time_to_first_token_seconds",
            "Time to first token.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.e2e = Histogram(
            P + "e2e_request_latency_seconds",
            "End-to-end request latency.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )

    def observe(self, endpoint: str, meta_info: dict[str, Any], stream: bool = False) -> None:
        self.sglang.observe(meta_info, stream)
        self.http_requests.labels(endpoint=endpoint).inc()
        if isinstance(meta_info.get("ttft"), (int, float)):
            self.ttft.observe(meta_info["ttft"])
        if isinstance(meta_info.get("e2e_latency"), (int, float)):
            self.e2e.observe(meta_info["e2e_latency"])

    def aborted(self, n: int) -> None:
        self.sglang.aborted.labels(**self.sglang.labels).inc(n)

    def render(self) -> bytes:
        return generate_latest(self.registry)
