"""Prometheus metrics under SGLang's names, types, labels and buckets (sglang 0.5.23,
`sglang/srt/observability/metrics_collector.py`), so SGLang's Grafana dashboard reads this server
unchanged. Only what this engine measures truthfully is exported; our own `radixagent:*` cache
figures stay beside them (runtime/server/metrics.py).

Two label sets, as in SGLang: scheduler gauges carry {model_name, engine_type, tp_rank, pp_rank,
moe_ep_rank}; per-request families (SGLang's tokenizer manager) carry {model_name, engine_type}
plus `is_streaming` where SGLang has it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from runtime.engine.engine import Engine

S = "sglang:"
#: SGLang's default buckets (TokenizerMetricsCollector)
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = TTFT_BUCKETS + (600, 1200, 1800, 2400)
ITL_BUCKETS = (
    0.002,
    0.004,
    0.006,
    0.008,
    0.010,
    0.015,
    0.020,
    0.025,
    0.030,
    0.035,
    0.040,
    0.060,
    0.080,
    0.100,
    0.200,
    0.400,
    0.600,
    0.800,
    1.000,
    2.000,
    4.000,
    6.000,
    8.000,
)
TOKEN_BUCKETS = (
    100,
    300,
    500,
    700,
    1000,
    1500,
    2000,
    3000,
    4000,
    5000,
    6000,
    7000,
    8000,
    9000,
    10000,
    12500,
    15000,
    17500,
    20000,
    22500,
    25000,
    27500,
    30000,
    35000,
    40000,
    60000,
    80000,
    100000,
    200000,
    300000,
    400000,
    600000,
    800000,
    1000000,
    1100000,
)


def _used(stats: dict[str, Any]) -> int:
    """SGLang's definition: slots neither free nor evictable (held by running requests or locked)."""
    return int(stats["pool_capacity_tokens"] - stats["pool_free_tokens"] - stats["evictable_tokens"])


# (name, documentation as SGLang's, value from get_cache_stats() + the pool/context constants)
_SCHEDULER_GAUGES = (
    ("num_running_reqs", "The number of running requests.", lambda s: s["running"]),
    ("num_queue_reqs", "The number of requests in the waiting queue.", lambda s: s["queue_depth"]),
    # grammars compile when a request is built, before it queues: this queue is always empty
    ("num_grammar_queue_reqs", "The number of requests in the grammar waiting queue.", lambda s: 0),
    ("gen_throughput", "The generation throughput (token/s).", lambda s: s["gen_throughput"]),
    ("cache_hit_rate", "The prefix cache hit rate.", lambda s: s["last_prefill_hit_rate"]),
    ("token_usage", "The token usage.", lambda s: _used(s) / s["pool_capacity_tokens"]),
    (
        "full_token_usage",
        "The token usage for full attention layers.",
        lambda s: _used(s) / s["pool_capacity_tokens"],
    ),
    ("num_used_tokens", "The number of used tokens.", lambda s: _used(s)),
    (
        "kv_available_tokens",
        "Number of free token slots in the KV cache pool.",
        lambda s: s["pool_free_tokens"],
    ),
    (
        "kv_evictable_tokens",
        "Number of evictable (radix-cached) token slots in the KV cache pool.",
        lambda s: s["evictable_tokens"],
    ),
    ("kv_used_tokens", "Number of actively used token slots in the KV cache pool.", lambda s: _used(s)),
    (
        "max_total_num_tokens",
        "Maximum total number of tokens in the KV cache pool.",
        lambda s: s["pool_capacity_tokens"],
    ),
    ("page_size", "The page size of the KV cache.", lambda s: 1),
    ("num_pages", "The number of pages in the KV cache pool.", lambda s: s["pool_capacity_tokens"]),
    ("context_len", "The context length of the model.", lambda s: s["context_len"]),
)


def scheduler_labels(model_name: str) -> dict[str, str]:
    """SGLang's scheduler labels for a single-rank, non-disaggregated server."""
    return {
        "model_name": model_name,
        "engine_type": "unified",
        "tp_rank": "0",
        "pp_rank": "0",
        "moe_ep_rank": "0",
    }


class SGLangSchedulerCollector(Collector):
    """Scheduler gauges and the eviction counter, read from one `get_cache_stats()` per scrape."""

    def __init__(self, engine: Engine, model_name: str) -> None:
        self.engine = engine
        self.labels = scheduler_labels(model_name)

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        stats = dict(self.engine.get_cache_stats())
        stats["context_len"] = self.engine.info().context_length
        if "evictable_tokens" not in stats or not stats.get("pool_capacity_tokens"):
            return  # an engine without SGLang's live figures: export nothing rather than zeros
        names, values = list(self.labels), list(self.labels.values())
        for name, doc, value in _SCHEDULER_GAUGES:
            family = GaugeMetricFamily(S + name, doc, labels=names)
            family.add_metric(values, float(value(stats)))
            yield family
        evicted = CounterMetricFamily(
            S + "evicted_tokens", "The number of tokens evicted from the radix cache.", labels=names
        )
        evicted.add_metric(values, float(stats.get("evicted_tokens", 0)))
        yield evicted


class SGLangRequestMetrics:
    """SGLang's per-request families (its TokenizerMetricsCollector), observed as responses finish."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        self.labels = {"model_name": model_name, "engine_type": "unified"}
        base, streaming = list(self.labels), [*self.labels, "is_streaming"]

        def counter(name: str, doc: str, labels: list[str]) -> Counter:
            return Counter(S + name, doc, labels, registry=registry)

        def histogram(name: str, doc: str, labels: list[str], buckets: tuple) -> Histogram:
            return Histogram(S + name, doc, labels, buckets=buckets, registry=registry)

        self.prompt_tokens = counter("prompt_tokens_total", "Number of prefill tokens processed.", streaming)
        self.generation_tokens = counter(
            "generation_tokens_total", "Number of generation tokens processed.", streaming
        )
        self.cached_tokens = counter(
            "cached_tokens_total",
            "Number of cached prompt tokens by source (device/host/storage).",
            [*base, "cache_source"],
        )
        self.requests = counter("num_requests_total", "Number of requests processed.", streaming)
        self.aborted = counter("num_aborted_requests_total", "Number of requests aborted.", base)
        self.aborted.labels(**self.labels)  # a 0 sample from the start, as a fresh SGLang server shows
        self.ttft = histogram(
            "time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            streaming,
            TTFT_BUCKETS,
        )
        self.itl = histogram(
            "inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", base, ITL_BUCKETS
        )
        self.tpot = histogram(
            "request_time_per_output_token_seconds",
            "Per-request TPOT in seconds: (finished_time - first_token_time) / (completion_tokens - 1).",
            streaming,
            ITL_BUCKETS,
        )
        self.e2e = histogram(
            "e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            streaming,
            E2E_BUCKETS,
        )
        self.prompt_hist = histogram(
            "prompt_tokens_histogram", "Histogram of prompt token length.", base, TOKEN_BUCKETS
        )
        self.uncached_hist = histogram(
            "uncached_prompt_tokens_histogram",
            "Histogram of uncached (compute) prompt token length.",
            base,
            TOKEN_BUCKETS,
        )
        self.generation_hist = histogram(
            "generation_tokens_histogram", "Histogram of generation token length.", base, TOKEN_BUCKETS
        )

    def observe(self, meta: dict[str, Any], stream: bool) -> None:
        """One finished request's meta_info (prompt/completion/cached tokens, ttft, e2e_latency)."""
        flag = {**self.labels, "is_streaming": "true" if stream else "false"}
        prompt, completion = int(meta.get("prompt_tokens", 0)), int(meta.get("completion_tokens", 0))
        cached = int(meta.get("cached_tokens", 0) or 0)
        self.prompt_tokens.labels(**flag).inc(prompt)
        self.generation_tokens.labels(**flag).inc(completion)
        if cached > 0:  # every cached token sits in the one in-memory pool: SGLang's "device"
            self.cached_tokens.labels(**self.labels, cache_source="device").inc(cached)
        self.requests.labels(**flag).inc()
        self.prompt_hist.labels(**self.labels).observe(prompt)
        self.uncached_hist.labels(**self.labels).observe(prompt - cached)
        self.generation_hist.labels(**self.labels).observe(completion)
        ttft, e2e = meta.get("ttft"), meta.get("e2e_latency")
        if isinstance(e2e, (int, float)):
            self.e2e.labels(**flag).observe(e2e)
        if isinstance(ttft, (int, float)) and completion > 0:
            self.ttft.labels(**flag).observe(ttft)
        if isinstance(ttft, (int, float)) and isinstance(e2e, (int, float)) and completion > 1:
            per_token = max(e2e - ttft, 0.0) / (completion - 1)
            self.tpot.labels(**flag).observe(per_token)
            itl = self.itl.labels(**self.labels)
            for _ in range(completion - 1):  # SGLang observes each interval; we know their mean
                itl.observe(per_token)
