"""`radixagent serve` flags (SGLang's names where SGLang has the flag) and the server's frozen config."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any

from runtime.cache.kv_format import KV_CACHE_DTYPES
from runtime.config import ATTENTION_BACKENDS, TORCHAO_CONFIGS

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
DTYPES = ("auto", "float32", "float", "bfloat16", "float16", "half")


@dataclass(frozen=True, slots=True)
class ServerArgs:
    """What the HTTP layer needs; engine settings live in the engine's own config."""

    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None
    #: SGLang's --admin-api-key: needed for runtime/server/auth.py's ADMIN_PATHS
    admin_api_key: str | None = None
    enable_metrics: bool = False
    require_cache_salt: bool = False
    #: serve GET /debug/integrity (runs the engine's integrity check; for tests and soak runs)
    enable_debug_endpoints: bool = False
    served_model_name: str | None = None
    log_level: str = "info"
    #: worker threads for blocking engine calls (each in-flight request or stream step holds one)
    max_threads: int = 64
    #: larger request bodies get 413 before they are parsed
    max_request_bytes: int = 32 * 2**20
    #: how tool calls look in the model's output (runtime/server/tools/formats.py)
    tool_call_parser: str = "qwen25"
    #: splits the thinking block out of outputs (runtime/server/reasoning.py); None: off
    reasoning_parser: str | None = None
    #: earlier assistant turns: `preserve` (as generated) or `template` (the template's rendering)
    reasoning_history: str = "preserve"
    #: seconds a request may take to arrive whole (headers and body) once begun
    timeout_read: float = 30.0
    #: seconds an idle keep-alive connection is kept (uvicorn's own flag)
    timeout_keep_alive: float = 5.0
    #: connections held at once; more are answered 503 and closed
    limit_concurrency: int = 512
    #: bytes h11 buffers for an incomplete event (the request line and headers)
    h11_max_incomplete_event_size: int = 64 * 1024
    #: per-step traces of named sessions (runtime/server/trace_dir.py); None: off
    trace_dir: str | None = None
    #: a trace file is rotated past this size
    trace_max_bytes: int = 16 * 2**20
    #: all trace files together; rotated files go first, then lines are dropped (counted)
    trace_max_total_bytes: int = 2**30
    #: seconds /update_weights_from_disk waits for running requests (new ones wait behind it)
    weights_swap_wait_s: float = 10.0
    #: stored responses (previous_response_id, GET /v1/responses/{id}) are bounded to this many MiB
    responses_store_max_mb: int = 256
    #: reported as meta_info.worker_id (`radixagent cluster` names each worker: routing misses)
    worker_id: str | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {LOG_LEVELS}")
        if self.api_key == "":
            raise ValueError("api_key must not be empty (omit it to disable auth)")
        if self.max_request_bytes < 1024:
            raise ValueError("max_request_bytes must be >= 1024")
        if not self.weights_swap_wait_s > 0:
            raise ValueError("weights_swap_wait_s must be > 0")
        if self.responses_store_max_mb < 1:
            raise ValueError("responses_store_max_mb must be >= 1")
        if self.max_threads < 1:
            raise ValueError("max_threads must be >= 1")
        from runtime.server.tools.formats import FORMATS

        if self.tool_call_parser not in FORMATS:
            raise ValueError(f"tool_call_parser must be one of {sorted(FORMATS)}")
        from runtime.server.reasoning import PARSERS
        from runtime.server.reasoning_history import HISTORY_MODES

        if self.reasoning_parser is not None and self.reasoning_parser not in PARSERS:
            raise ValueError(f"reasoning_parser must be one of {sorted(PARSERS)}")
        if self.reasoning_history not in HISTORY_MODES:
            raise ValueError(f"reasoning_history must be one of {HISTORY_MODES}")
        if not (self.timeout_read > 0 and self.timeout_keep_alive > 0):
            raise ValueError("timeout_read and timeout_keep_alive must be > 0")
        if self.limit_concurrency < 1 or self.h11_max_incomplete_event_size < 1024:
            raise ValueError("limit_concurrency must be >= 1 and h11_max_incomplete_event_size >= 1024")

    def public_dict(self) -> dict[str, object]:
        """For /get_server_info: everything but the key."""
        return {
            "host": self.host,
            "port": self.port,
            "api_key_set": self.api_key is not None,
            "admin_api_key_set": self.admin_api_key is not None,
            "enable_metrics": self.enable_metrics,
            "require_cache_salt": self.require_cache_salt,
            "enable_debug_endpoints": self.enable_debug_endpoints,
            "served_model_name": self.served_model_name,
            "log_level": self.log_level,
            "tool_call_parser": self.tool_call_parser,
            "reasoning_parser": self.reasoning_parser,
            "reasoning_history": self.reasoning_history,
            "max_threads": self.max_threads,
            "max_request_bytes": self.max_request_bytes,
            "timeout_read": self.timeout_read,
            "timeout_keep_alive": self.timeout_keep_alive,
            "limit_concurrency": self.limit_concurrency,
            "trace_dir_set": self.trace_dir is not None,
            "responses_store_max_mb": self.responses_store_max_mb,
        }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="radixagent serve",
        description="SGLang-compatible HTTP server (native /generate, OpenAI chat/completions/responses, "
        "Anthropic messages) over the embedded engine.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _model_flags(p)
    _server_flags(p)
    _limit_flags(p)
    _chat_flags(p)
    _trace_flags(p)
    _tier_flags(p)
    return p


def _model_flags(p: argparse.ArgumentParser) -> None:
    """What runs: the weights, their format and the engine's cache and kernels."""
    g = p.add_argument_group("model and engine")
    g.add_argument("--model-path", default=None, help="HF folder or GGUF file (default: the bundled model)")
    g.add_argument("--served-model-name", default=None, help="model name reported by /v1/models")
    g.add_argument("--max-total-tokens", type=int, default=None, help="KV pool size in tokens")
    g.add_argument(
        "--context-length",
        type=int,
        default=None,
        help="longest prompt + output in tokens (default: the model's)",
    )
    g.add_argument(
        "--radix-eviction-policy",
        default="lru",
        choices=_policy_names(),
        help="which cached prefix goes first under memory pressure (session: keeps live agent sessions')",
    )
    g.add_argument("--disable-radix-cache", action="store_true", help="turn the prefix cache off")
    g.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPES,
        help="auto: on the CPU int4wo-32 weights with bfloat16 activations (the exact fast path), bfloat16 with "
        "--torchao-config, float32 on a GPU; a dtype given alone means dense weights (float32: greedy outputs "
        "match HF transformers)",
    )
    g.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the model runs")
    g.add_argument(
        "--torchao-config",
        default="",
        choices=("", *TORCHAO_CONFIGS),
        help="weight-only quantization (CPU engine): int4wo-32 runs the GGUF's own 4-bit levels, several times "
        "faster decode, cached = uncached bit for bit; outputs differ from float32. Default: int4wo-32 on the CPU "
        "unless --dtype is given",
    )
    g.add_argument(
        "--kv-cache-dtype",
        default="auto",
        metavar="{" + ",".join(KV_CACHE_DTYPES) + "}",
        help="how K/V is stored: auto (the model's dtype), float32, bfloat16 (bf16), float16 (fp16), int8 (a "
        "scale per token and head: 3.8x the tokens of float32 per byte); attention runs in float32",
    )
    g.add_argument(
        "--enable-deterministic-inference",
        action="store_true",
        help="batch-invariant kernels for dense weights too (quantized weights with the native kernel, the "
        "default, are exact without it): bit-identical outputs cached or not, batched or alone; float32 "
        "weights take a fixed-order matmul",
    )
    g.add_argument(
        "--attention-backend",
        default=None,
        choices=ATTENTION_BACKENDS,
        help="decode attention: native_cpu reads the stored KV format directly (built with the system C "
        "compiler on first use), torch_native runs PyTorch SDPA over float32 K/V; default: native_cpu "
        "where it builds",
    )
    g.add_argument("--num-threads", type=int, default=None, help="torch CPU threads")


def _server_flags(p: argparse.ArgumentParser) -> None:
    """Where it listens, who may call what, and what it reports."""
    g = p.add_argument_group("server and access")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    g.add_argument("--port", type=int, default=30000, help="TCP port; checked before the model loads")
    g.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (all but /health)")
    g.add_argument(
        "--admin-api-key",
        default=None,
        help="key for /update_weights_from_disk, /flush_cache, /abort_request (refused without it under --api-key)",
    )
    g.add_argument(
        "--require-cache-salt", action="store_true", help="reject generation requests without cache_salt"
    )
    g.add_argument("--enable-metrics", action="store_true", help="serve Prometheus metrics at /metrics")
    g.add_argument(
        "--enable-debug-endpoints",
        action="store_true",
        help="serve GET /debug/integrity (cache invariants and lock counts; not for untrusted clients)",
    )
    g.add_argument("--log-level", default="info", choices=LOG_LEVELS, help="server log verbosity")


def _limit_flags(p: argparse.ArgumentParser) -> None:
    """What one client can take: queue, body size, threads, time, connections."""
    g = p.add_argument_group("limits")
    g.add_argument("--max-queue", type=int, default=256, help="queued requests before 503")
    g.add_argument(
        "--max-request-bytes",
        type=int,
        default=32 * 2**20,
        help="request bodies over this many bytes get HTTP 413",
    )
    g.add_argument(
        "--max-threads",
        type=int,
        default=64,
        help="generation requests served at once; more get 503 at once (streams count until "
        "their first token)",
    )
    g.add_argument(
        "--timeout-read",
        type=float,
        default=30.0,
        help="seconds a request may take to arrive whole (headers and body); then 408 / closed",
    )
    g.add_argument("--timeout-keep-alive", type=float, default=5.0, help="seconds an idle connection is kept")
    g.add_argument(
        "--limit-concurrency",
        type=int,
        default=512,
        help="connections held at once; more are answered 503 and closed",
    )
    g.add_argument(
        "--h11-max-incomplete-event-size",
        type=int,
        default=64 * 1024,
        help="bytes of request line and headers buffered before a 400",
    )
    g.add_argument(
        "--weights-swap-wait-s",
        type=float,
        default=10.0,
        help="how long /update_weights_from_disk waits for running requests; new requests wait "
        "behind it at most this long, then the update fails (409) and they run",
    )


def _chat_flags(p: argparse.ArgumentParser) -> None:
    """How chat output is parsed and earlier turns rendered, and what the Responses door stores."""
    g = p.add_argument_group("chat, tools and reasoning")
    g.add_argument(
        "--tool-call-parser",
        default="qwen25",
        choices=_tool_formats(),
        help="tool-call format in the model's output (SGLang's names; qwen25 = hermes-style <tool_call>{...}</tool_call>)",
    )
    g.add_argument(
        "--reasoning-parser",
        default=None,
        choices=("qwen3", "deepseek-r1"),
        help="return the thinking block apart: message.reasoning_content / delta.reasoning_content "
        "(SGLang's names; see docs/models.md)",
    )
    g.add_argument(
        "--reasoning-history",
        default="preserve",
        choices=("preserve", "template"),
        help="earlier assistant turns: preserve = rendered exactly as generated (the cache keeps "
        "them), template = the chat template's rendering (a template that drops thinking shows as "
        "template_rewrite in the trace)",
    )
    g.add_argument(
        "--responses-store-max-mb",
        type=int,
        default=256,
        help="memory for stored responses (previous_response_id, GET /v1/responses/{id}); the least "
        "recently used are dropped past it (default: %(default)s)",
    )


def _trace_flags(p: argparse.ArgumentParser) -> None:
    """The per-step trace, and what a cluster's router and workers see."""
    g = p.add_argument_group("trace, cluster and KV events")
    g.add_argument(
        "--trace-dir",
        default=None,
        help="write the per-step trace (ideal hits, prefix breaks, miss causes) of every request that "
        "names its session (session_id, session_params, prompt_cache_key or X-Session-Id) to "
        "DIR/<salt digest>.jsonl",
    )
    g.add_argument(
        "--trace-max-bytes", type=int, default=16 * 2**20, help="rotate a trace file past this size"
    )
    g.add_argument(
        "--trace-max-total-bytes",
        type=int,
        default=2**30,
        help="disk for all trace files: rotated files are deleted first, then lines dropped (counted)",
    )
    g.add_argument(
        "--worker-id",
        default=None,
        help="a name for this worker, reported as meta_info.worker_id (radixagent cluster sets it)",
    )
    g.add_argument(
        "--kv-events-config",
        default=None,
        help="publish KV cache events for cache-aware routers, SGLang's JSON, e.g. "
        '\'{"publisher":"zmq","endpoint":"tcp://*:5557","topic":"kv-events"}\' (docs/cluster.md; '
        "events carry token ids: trusted networks only, docs/security.md)",
    )
    g.add_argument(
        "--page-size",
        type=int,
        default=1,
        help="block size of KV events in tokens (the cache itself stays token-level)",
    )


def _tier_flags(p: argparse.ArgumentParser) -> None:
    """SGLang HiCache's flag names (runtime/cache/tier/); --hicache-storage-url is ours."""
    g = p.add_argument_group("KV tier (hierarchical cache)")
    g.add_argument("--enable-hierarchical-cache", action="store_true", help="spill evicted KV to a store")
    g.add_argument(
        "--hicache-storage-backend",
        default="file",
        choices=("file", "redis"),
        help="where the KV tier stores pages",
    )
    g.add_argument("--hicache-storage-dir", default=None, help="directory of the file backend")
    g.add_argument(
        "--hicache-size",
        type=float,
        default=None,
        help="GB the file backend may hold (default 4; refused with redis)",
    )
    g.add_argument(
        "--hicache-write-policy",
        default=None,
        choices=("write_back", "write_through"),
        help="default: write_back for file, write_through for redis",
    )
    g.add_argument("--hicache-storage-url", default="redis://127.0.0.1:6379/0", help="the redis backend")
    g.add_argument("--hicache-page-tokens", type=int, default=64, help="tokens per stored page")
    g.add_argument("--disable-hicache-prefetch", action="store_true", help="no session-aware prefetch")
    g.add_argument(
        "--hicache-write-queue-mb",
        type=float,
        default=128.0,
        help="MiB of evicted pages queued for the background writer (0: write on the engine thread)",
    )
    g.add_argument(
        "--hicache-mac-key",
        default=os.environ.get("RADIXAGENT_HICACHE_MAC_KEY"),
        help="key that authenticates stored pages; every worker sharing a tier needs the same one "
        "(prefer the RADIXAGENT_HICACHE_MAC_KEY environment variable: a command line is visible to "
        "other local users). Default: kept in the file backend's directory, or one per server with redis",
    )


def _tool_formats() -> list[str]:
    from runtime.server.tools.formats import FORMATS

    return sorted(FORMATS)


def _policy_names() -> list[str]:
    from runtime.cache.policies import POLICIES

    return sorted(POLICIES)


def engine_config(ns: argparse.Namespace) -> dict[str, Any]:
    """Engine keyword arguments from parsed flags (unset flags are left to the engine's defaults)."""
    dtype = {"auto": None, "float": "float32", "half": "float16"}.get(ns.dtype, ns.dtype)
    config: dict[str, Any] = {
        "max_total_tokens": ns.max_total_tokens,
        "radix_eviction_policy": ns.radix_eviction_policy,
        "disable_radix_cache": ns.disable_radix_cache,
        "dtype": dtype,
        "device": ns.device,
        "torchao_config": ns.torchao_config or None,
        "kv_cache_dtype": ns.kv_cache_dtype,
        "enable_deterministic_inference": ns.enable_deterministic_inference,
        "attention_backend": ns.attention_backend,
        "context_length": ns.context_length,
        "num_threads": ns.num_threads,
        "max_queue": ns.max_queue,
        "served_model_name": ns.served_model_name,
        "kv_events_config": ns.kv_events_config,
        "page_size": ns.page_size,
    }
    if ns.enable_hierarchical_cache:
        config |= {
            "enable_hierarchical_cache": True,
            "hicache_storage_backend": ns.hicache_storage_backend,
            "hicache_storage_dir": ns.hicache_storage_dir,
            "hicache_size": ns.hicache_size,
            "hicache_write_policy": ns.hicache_write_policy,
            "hicache_storage_url": ns.hicache_storage_url,
            "hicache_page_tokens": ns.hicache_page_tokens,
            "hicache_prefetch": not ns.disable_hicache_prefetch,
            "hicache_write_queue_mb": ns.hicache_write_queue_mb,
            "hicache_mac_key": ns.hicache_mac_key,
        }
    keep_false = {"disable_radix_cache"}
    return {k: v for k, v in config.items() if v is not None or k in keep_false}


def server_args(ns: argparse.Namespace) -> ServerArgs:
    return ServerArgs(
        host=ns.host,
        port=ns.port,
        api_key=ns.api_key,
        admin_api_key=getattr(ns, "admin_api_key", None),
        enable_metrics=ns.enable_metrics,
        require_cache_salt=ns.require_cache_salt,
        enable_debug_endpoints=ns.enable_debug_endpoints,
        served_model_name=ns.served_model_name,
        log_level=ns.log_level,
        max_request_bytes=ns.max_request_bytes,
        tool_call_parser=ns.tool_call_parser,
        reasoning_parser=ns.reasoning_parser,
        reasoning_history=ns.reasoning_history,
        max_threads=ns.max_threads,
        timeout_read=ns.timeout_read,
        timeout_keep_alive=ns.timeout_keep_alive,
        limit_concurrency=ns.limit_concurrency,
        h11_max_incomplete_event_size=ns.h11_max_incomplete_event_size,
        trace_dir=ns.trace_dir,
        trace_max_bytes=ns.trace_max_bytes,
        trace_max_total_bytes=ns.trace_max_total_bytes,
        responses_store_max_mb=ns.responses_store_max_mb,
        weights_swap_wait_s=ns.weights_swap_wait_s,
        worker_id=ns.worker_id,
    )
