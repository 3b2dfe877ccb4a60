"""A background sampler of process memory during an eval: RSS (psutil), GPU memory when torch has
CUDA, and the prefix cache's bytes in use when the backend can report them (embedded engine).

Mutation: only the sampler thread appends to `samples`; read them after `stop()` (or copy them
with `snapshot()` while it runs).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import psutil

#: () -> (cache bytes in use, pool capacity bytes); None when the backend cannot tell
CacheProbe = Callable[[], tuple[int, int]]


@dataclass(slots=True)
class Sample:
    t_s: float
    rss_bytes: int
    gpu_bytes: int | None
    cache_bytes: int | None
    phase: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _gpu_bytes() -> int | None:
    torch = sys.modules.get("torch")  # never import torch just to look (URL backends stay light)
    if torch is None or not torch.cuda.is_available():
        return None
    return int(torch.cuda.memory_allocated())


class ResourceSampler:
    """Samples every `interval_s` seconds on a daemon thread; `phase` labels what is running."""

    def __init__(self, interval_s: float = 0.5, cache_probe: CacheProbe | None = None) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.interval_s, self.cache_probe = interval_s, cache_probe
        self.samples: list[Sample] = []
        self.phase = "setup"
        self.pool_capacity_bytes: int | None = None
        self._process = psutil.Process()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="eval-resource-sampler", daemon=True)
        self._origin = time.perf_counter()

    def start(self) -> ResourceSampler:
        self._origin = time.perf_counter()
        self._thread.start()
        return self

    def stop(self) -> list[Sample]:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.sample()  # the final state
        return self.snapshot()

    def snapshot(self) -> list[Sample]:
        with self._lock:
            return list(self.samples)

    def sample(self) -> None:
        # time and RSS first: the cache probe may wait for the engine's current forward step
        t_s, rss = time.perf_counter() - self._origin, self._process.memory_info().rss
        cache_bytes = None
        if self.cache_probe is not None:
            try:
                cache_bytes, self.pool_capacity_bytes = self.cache_probe()
            except Exception:  # a probe failing (engine shut down) must not stop the eval
                self.cache_probe = None
        sample = Sample(
            t_s=t_s, rss_bytes=rss, gpu_bytes=_gpu_bytes(), cache_bytes=cache_bytes, phase=self.phase
        )
        with self._lock:
            self.samples.append(sample)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)


def summarize(samples: list[Sample], pool_capacity_bytes: int | None) -> dict[str, Any]:
    """The results.json `resources` object: peaks and the pool size the cache is bounded by."""
    rss = [s.rss_bytes for s in samples]
    gpu = [s.gpu_bytes for s in samples if s.gpu_bytes is not None]
    cache = [s.cache_bytes for s in samples if s.cache_bytes is not None]
    return {
        "samples": len(samples),
        "rss_start_bytes": rss[0] if rss else None,
        "rss_peak_bytes": max(rss) if rss else None,
        "gpu_peak_bytes": max(gpu) if gpu else None,
        "cache_peak_bytes": max(cache) if cache else None,
        "pool_capacity_bytes": pool_capacity_bytes,
    }
