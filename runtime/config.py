"""The engine's frozen configuration."""

from __future__ import annotations

from dataclasses import dataclass

import psutil

from runtime.cache.policies import POLICIES
from runtime.env import env_flag, env_str, offline_hub  # noqa: F401  (re-exported)

DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model_path: str | None = None
    #: KV pool size in tokens; None = derived from available memory (see `derive_pool_size`)
    max_total_tokens: int | None = None
    radix_eviction_policy: str = "lru"
    disable_radix_cache: bool = False
    dtype: str = "float32"
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

    def __post_init__(self) -> None:
        problems = []
        if self.max_total_tokens is not None and self.max_total_tokens < 16:
            problems.append("max_total_tokens must be >= 16")
        if self.radix_eviction_policy not in POLICIES:
            problems.append(f"radix_eviction_policy must be one of {sorted(POLICIES)}")
        if self.dtype not in DTYPES:
            problems.append(f"dtype must be one of {DTYPES}")
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
        if problems:
            raise ValueError("invalid engine config: " + "; ".join(problems))


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
