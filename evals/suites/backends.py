"""The two sides of the comparison: how "cached" and "uncached" are obtained for each kind of backend.

- embedded: cached = the engine; uncached = `engine.sibling(disable_radix_cache=True)`: the same
  engine code over the same weights with prefix matching off (no reload), and `prefix_cache=False`
  on every request as well.
- a server URL: `prefix_cache=false` on every request (our server honours it), detected by a probe;
  for a server that ignores it, the cache is flushed before every uncached request; or a second
  server started with `--disable-radix-cache` (`uncached_url`).
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from evals.suites.resources import CacheProbe
from runtime.backends.base import Backend

PROBE_TEXT = "Cache probe. " + "The quick brown fox jumps over the lazy dog. " * 12
METHODS = ("auto", "flag", "flush")


@dataclass(slots=True)
class EvalSetup:
    """Both sides of the comparison plus what the report says about them. `close` releases what
    the setup created (the uncached sibling engine, HTTP clients), never a caller's engine."""

    backend_label: str
    model: str
    machine: str
    method: str  # plain words: how the uncached mode was obtained
    cached: Backend
    uncached: Backend
    flush_each: bool = False
    cache_probe: CacheProbe | None = None
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        while self.closers:
            self.closers.pop()()


def describe_machine() -> str:
    """One line: CPU model, cores, RAM, GPU (when torch is loaded and sees one), Python."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            cpu = next((ln.split(":", 1)[1].strip() for ln in handle if ln.startswith("model name")), cpu)
    except OSError:
        pass
    parts = [cpu, f"{os.cpu_count()} cores", f"{psutil.virtual_memory().total / 2**30:.0f} GiB RAM"]
    torch = sys.modules.get("torch")
    if torch is not None:
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
        parts += [gpu, f"torch {torch.__version__} ({torch.get_num_threads()} threads)"]
    parts.append(f"Python {platform.python_version()}")
    return ", ".join(parts)


def embedded_setup(engine: Any, concurrency: int = 1) -> EvalSetup:
    """Cached: `engine`. Uncached: its sibling with the radix cache disabled (a pool just big
    enough for `concurrency` full contexts, since it never keeps anything)."""
    from runtime.backends.embedded import EmbeddedBackend

    pool = min(engine.pool.size, engine.context_length * max(concurrency, 1))
    sibling = engine.sibling(disable_radix_cache=True, max_total_tokens=pool)

    def probe() -> tuple[int, int]:
        stats = engine.get_cache_stats()
        return int(stats["bytes_in_use"]), int(stats["pool_capacity_bytes"])

    return EvalSetup(
        backend_label="embedded",
        model=str(engine.model_name),
        machine=f"{describe_machine()}; dtype {engine.config.dtype}",
        method="embedded: the same engine code over the same weights, once with the radix cache "
        "(cached) and once as `engine.sibling(disable_radix_cache=True)` with "
        "`prefix_cache=False` on every request (uncached)",
        cached=EmbeddedBackend(engine),
        uncached=EmbeddedBackend(sibling),
        cache_probe=probe,
        closers=[sibling.shutdown],
    )


def open_embedded(concurrency: int = 1, **engine_options: Any) -> EvalSetup:
    """An engine built here (and shut down by `close`), then `embedded_setup`."""
    from runtime import Engine

    engine = Engine(**engine_options)
    setup = embedded_setup(engine, concurrency)
    setup.closers.insert(0, engine.shutdown)
    return setup


def probe_honours_flag(backend: Backend) -> bool:
    """True when the server honours `prefix_cache=False`: the same prompt sent twice without the
    cache must report no cached tokens the second time. Not counted in any metric."""
    params = {"max_new_tokens": 1, "temperature": 0.0}
    backend.generate(PROBE_TEXT, sampling_params=params, prefix_cache=False)
    again = backend.generate(PROBE_TEXT, sampling_params=params, prefix_cache=False)
    return again.cached_tokens == 0


def url_setup(target: str, method: str = "auto", uncached_target: str | None = None) -> EvalSetup:
    """A server at `target` for both modes (see the module docstring for `method`), or
    `uncached_target`: a second server started with `--disable-radix-cache`."""
    from runtime.backends import connect

    if method not in METHODS:
        raise ValueError(f"uncached method must be one of {METHODS}, got {method!r}")
    cached = connect(target)
    closers: list[Callable[[], None]] = [cached.close]
    if uncached_target is not None:
        uncached = connect(uncached_target)
        closers.append(uncached.close)
        how = f"a second server at {uncached_target} (started with --disable-radix-cache)"
        flush_each = False
    else:
        uncached = cached
        flush_each = method == "flush" or (method == "auto" and not probe_honours_flag(cached))
        if flush_each and not cached.flush_cache():
            for close in closers:
                close()
            raise ValueError(
                f"{target} ignores prefix_cache=false and cannot flush its cache: start a "
                "second server with --disable-radix-cache and pass it as --uncached-backend"
            )
        how = (
            "the same server, its cache flushed before every uncached request (POST /flush_cache)"
            if flush_each
            else "the same server with `prefix_cache: false` on every uncached request"
        )
    return EvalSetup(
        backend_label=target,
        model=_model_name(cached),
        machine=f"client: {describe_machine()}",
        method=how,
        cached=cached,
        uncached=uncached,
        flush_each=flush_each,
        closers=closers,
    )


def _model_name(backend: Backend) -> str:
    info = getattr(backend, "model_info", None)
    try:
        if callable(info):
            data = info()
            return str(data.get("served_model_name") or data.get("model_path") or "unknown")
        model = getattr(backend, "model", None)
        return str(model() if callable(model) else model or "unknown")
    except Exception:  # a name is cosmetic: never fail the eval for it
        return "unknown"


def open_setup(
    target: str,
    *,
    concurrency: int = 1,
    method: str = "auto",
    uncached_target: str | None = None,
    **engine_options: Any,
) -> EvalSetup:
    """ "embedded" (engine options apply) or a server URL."""
    if target == "embedded":
        return open_embedded(concurrency, **engine_options)
    return url_setup(target, method, uncached_target)
