"""The engine's frozen configuration."""

from __future__ import annotations

from dataclasses import dataclass, field

import psutil

from runtime.cache.kv_format import canonical, kv_cache_dtype_problems
from runtime.cache.policies import POLICIES
from runtime.env import env_str, offline_hub  # noqa: F401  (re-exported)

DTYPES = ("float32", "bfloat16", "float16")
#: weight-only quantization, named as SGLang's --torchao-config values (runtime/model/quant.py)
TORCHAO_CONFIGS = ("int4wo-32", "int4wo-64", "int4wo-128", "int8wo")
#: --attention-backend values (SGLang's flag; these two are the ones this engine has)
ATTENTION_BACKENDS = ("native_cpu", "torch_native")
#: the CPU engine's weights when neither dtype nor torchao_config is given: the exact fast path
#: (runtime/model/model.py `LlamaModel.exact`; README "Defaults" for the measured choice)
DEFAULT_TORCHAO = "int4wo-32"


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model_path: str | None = None
    #: KV pool size in tokens; None = derived from available memory (see `derive_pool_size`)
    max_total_tokens: int | None = None
    radix_eviction_policy: str = "lru"
    disable_radix_cache: bool = False
    #: activations (and dense weights): float32, bfloat16, float16. None: bfloat16 with quantized
    #: weights; with neither this nor `torchao_config` given, the CPU default (DEFAULT_TORCHAO, so
    #: bfloat16), float32 off the CPU. A dtype given alone means dense weights (float32: greedy
    #: outputs match HF transformers token for token)
    dtype: str | None = None
    #: weight-only quantization (SGLang's --torchao-config names): int4wo-32/64/128, int8wo; CPU only
    torchao_config: str | None = None
    #: how K/V is stored (SGLang's --kv-cache-dtype): auto (the model's dtype), float32, bfloat16,
    #: float16, int8 (a scale per token and head); runtime/cache/kv_format.py
    kv_cache_dtype: str = "auto"
    #: batch-invariant kernels (SGLang's --enable-deterministic-inference): a token's logits are the
    #: same bits cached or not, batched or alone, in any chunk. Quantized weights with the native
    #: kernel (the default) are so without it; this adds dense weights (LlamaModel.exact)
    enable_deterministic_inference: bool = False
    #: SGLang's --attention-backend: native_cpu (one-token attention read straight from the stored
    #: KV format, runtime/model/decode_kernel.py) or torch_native (PyTorch SDPA); None: native_cpu where
    #: it builds, else torch_native. Prompt rows run it too on the exact path (LlamaModel.exact),
    #: else SDPA.
    attention_backend: str | None = None
    context_length: int | None = None
    num_threads: int | None = None
    device: str = "cpu"
    #: waiting requests beyond this are refused with `Overloaded`
    max_queue: int = 256
    #: requests decoded together in one forward step
    max_running_requests: int = 16
    #: cap on new tokens (prefill chunks + decodes) per forward step: long prompts are chunked
    chunked_prefill_size: int = 1024
    #: fraction of available memory the pool may take when max_total_tokens is None
    mem_fraction: float = 0.25
    served_model_name: str | None = None
    seed: int = 0
    #: a second KV tier below the pool (SGLang's HiCache flags; runtime/cache/tier/): evicted
    #: prefixes are written to the storage backend and loaded back instead of recomputed
    enable_hierarchical_cache: bool = False
    #: file | redis (shared across workers)
    hicache_storage_backend: str = "file"
    #: the file backend's directory (required with it)
    hicache_storage_dir: str | None = None
    #: GB the file backend may hold on disk (least recently used pages go first); None: 4 GB.
    #: Redis is bounded by its own maxmemory, so setting this with redis is refused
    hicache_size: float | None = None
    #: write_back (on eviction) or write_through (on every publish); None: write_back with the
    #: file backend (a local tier only helps after eviction), write_through with redis (another
    #: worker can only hit what was written: evals/benchmarks/bench_tier.py measures both)
    hicache_write_policy: str | None = None
    #: the redis backend's server (our extension; SGLang configures its backends by extra config)
    hicache_storage_url: str = "redis://127.0.0.1:6379/0"
    #: tokens per stored page
    hicache_page_tokens: int = 64
    #: load a waiting session's prefix back before its tool is expected to return
    hicache_prefetch: bool = True
    #: MiB of page snapshots queued for the background writer (ours): evictions copy pages out
    #: of the pool and a writer thread stores them; a full queue drops further pages (counted).
    #: 0 writes on the engine thread (the evicting request waits for the store)
    hicache_write_queue_mb: float = 128.0
    #: the key of the tier pages' MAC (runtime/cache/tier/codec.py), shared by every worker of one
    #: tier; None: the file backend keeps one in its directory (0600), redis gets one per server
    #: (pages are then readable by this server only)
    hicache_mac_key: str | None = field(default=None, repr=False)
    #: SGLang's --kv-events-config JSON (runtime/cache/kv_events/config.py): publish what the tree
    #: holds to cache-aware routers; None or publisher "null": off
    kv_events_config: str | None = None
    #: SGLang's --page-size. The tree stays token-level; this is the block size of KV events
    #: (a page is announced once all its tokens are cached, withdrawn when any of them is evicted)
    page_size: int = 1
    #: dtype and torchao_config are the CPU default, not the caller's: a model that cannot take it
    #: (no compact forward, sizes the int4 groups do not divide) is built in float32 instead
    default_weights: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        problems = []
        if self.dtype is None and self.torchao_config is None and self.device == "cpu":
            object.__setattr__(self, "torchao_config", DEFAULT_TORCHAO)
            object.__setattr__(self, "default_weights", True)
        if self.page_size < 1:
            problems.append("page_size must be >= 1")
        if self.kv_events_config:
            from runtime.cache.kv_events.config import parse_kv_events_config

            try:
                parse_kv_events_config(self.kv_events_config)
            except ValueError as exc:
                problems.append(str(exc))
        if self.max_total_tokens is not None and self.max_total_tokens < 16:
            problems.append("max_total_tokens must be >= 16")
        if self.radix_eviction_policy not in POLICIES:
            problems.append(f"radix_eviction_policy must be one of {sorted(POLICIES)}")
        dtype = self.dtype if self.dtype is not None else ("bfloat16" if self.torchao_config else "float32")
        object.__setattr__(self, "dtype", dtype)
        if dtype not in DTYPES:
            problems.append(f"dtype must be one of {DTYPES}")
        if self.torchao_config is not None:
            problems += torchao_problems(self.torchao_config, self.device, dtype)
        if self.enable_deterministic_inference and self.device != "cpu":
            # batch invariance is a property of the kernels measured (runtime/model/attention.py): CPU, MKL
            problems.append("enable_deterministic_inference is measured for the CPU engine only (device cpu)")
        if self.attention_backend is not None and self.attention_backend not in ATTENTION_BACKENDS:
            problems.append(f"attention_backend must be one of {ATTENTION_BACKENDS}")
        if self.attention_backend == "native_cpu" and self.device != "cpu":
            problems.append("attention_backend native_cpu is a CPU kernel (device cpu)")
        if isinstance(self.kv_cache_dtype, str):
            object.__setattr__(self, "kv_cache_dtype", canonical(self.kv_cache_dtype))
            problems += kv_cache_dtype_problems(self.kv_cache_dtype)
        else:
            problems.append("kv_cache_dtype must be a string")
        if self.context_length is not None and self.context_length < 2:
            problems.append("context_length must be >= 2")
        if self.num_threads is not None and self.num_threads < 1:
            problems.append("num_threads must be >= 1")
        if self.max_queue < 1 or self.max_running_requests < 1:
            problems.append("max_queue and max_running_requests must be >= 1")
        if self.chunked_prefill_size < 16:
            problems.append("chunked_prefill_size must be >= 16")
        if not 0 < self.mem_fraction <= 0.9:
            problems.append("mem_fraction must be in (0, 0.9]")
        if self.enable_hierarchical_cache:
            problems += hicache_problems(self)
        if problems:
            raise ValueError("invalid engine config: " + "; ".join(problems))


def hicache_problems(cfg: EngineConfig) -> list[str]:
    from runtime.cache.tier.tier import BACKENDS, WRITE_POLICIES

    problems = []
    if cfg.hicache_storage_backend not in BACKENDS:
        problems.append(f"hicache_storage_backend must be one of {BACKENDS}")
    if cfg.hicache_storage_backend == "file" and not cfg.hicache_storage_dir:
        problems.append("hicache_storage_dir is required with hicache_storage_backend file")
    if cfg.hicache_size is not None and not cfg.hicache_size > 0:
        problems.append("hicache_size (GB) must be > 0")
    if cfg.hicache_storage_backend == "redis" and cfg.hicache_size is not None:
        problems.append(
            "hicache_size bounds the file backend only; bound Redis with its own maxmemory "
            "(and an allkeys-lru policy), or drop --hicache-size"
        )
    if cfg.hicache_mac_key is not None and len(cfg.hicache_mac_key) < 16:
        problems.append("hicache_mac_key must be at least 16 characters")
    if cfg.hicache_write_policy is not None and cfg.hicache_write_policy not in WRITE_POLICIES:
        problems.append(f"hicache_write_policy must be one of {WRITE_POLICIES}")
    if cfg.hicache_page_tokens < 1:
        problems.append("hicache_page_tokens must be >= 1")
    if not cfg.hicache_write_queue_mb >= 0:
        problems.append("hicache_write_queue_mb must be >= 0")
    if cfg.disable_radix_cache:
        problems.append("enable_hierarchical_cache needs the radix cache (drop disable_radix_cache)")
    return problems


def torchao_problems(config: str, device: str, dtype: str) -> list[str]:
    """Why a weight-only quantization setting cannot run (empty: it can). Shared with runtime/model/quant.py."""
    if config not in TORCHAO_CONFIGS:
        return [f"torchao_config must be one of {TORCHAO_CONFIGS}"]
    if device != "cpu":
        return [
            f"torchao_config {config} is implemented for the CPU engine only; on a GPU "
            "run SGLang with the same --torchao-config (radixagent launch-sglang)"
        ]
    if dtype != "bfloat16":
        return [f"torchao_config {config} runs bfloat16 activations: dtype must be bfloat16"]
    return []


def derive_pool_size(bytes_per_token: int, context_length: int, mem_fraction: float) -> int:
    """Tokens that fit in `mem_fraction` of available memory, capped at 16 contexts' worth."""
    budget = int(psutil.virtual_memory().available * mem_fraction)
    return max(context_length, min(budget // bytes_per_token, 16 * context_length))


def check_pool_fits(tokens: int, bytes_per_token: int) -> None:
    need, have = tokens * bytes_per_token, psutil.virtual_memory().available
    if need > 0.8 * have:
        raise ValueError(
            f"a KV pool of {tokens} tokens needs {need / 2**30:.1f} GiB but only "
            f"{have / 2**30:.1f} GiB is available: lower max_total_tokens"
        )
