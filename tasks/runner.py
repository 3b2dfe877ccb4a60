"""What the task runners share: backend wiring, cache control, JSONL output, progress, statistics."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from runtime.backends.base import Backend, Completion, WrappedBackend

#: greedy decoding everywhere: cached and uncached runs must produce identical outputs
GREEDY: dict[str, Any] = {"temperature": 0.0}
#: the model's context window when the backend cannot say (SmolLM2-135M: 8192)
DEFAULT_CONTEXT = 8192


class CacheControlBackend(WrappedBackend):
    """Delegates to `inner`, sending `prefix_cache` on every request (False: `--no-cache`)."""

    def __init__(self, inner: Backend, prefix_cache: bool) -> None:
        super().__init__(inner)
        self.prefix_cache = prefix_cache

    def generate(self, prompt: str | None = None, input_ids: list[int] | None = None,
                 sampling_params: dict[str, Any] | None = None, **kwargs: Any) -> Completion:  # fmt: skip
        kwargs["prefix_cache"] = self.prefix_cache and kwargs.get("prefix_cache", True)
        return self.inner.generate(prompt, input_ids, sampling_params, **kwargs)


def with_cache(backend: Backend, prefix_cache: bool) -> Backend:
    """`backend` itself when caching is on; a wrapper that sends prefix_cache=False otherwise."""
    return backend if prefix_cache else CacheControlBackend(backend, False)


def open_backend(spec: str, **options: Any) -> Backend:
    """`connect(spec)`: "embedded" (in-process engine), "http://host:port" or "openai:<url>"."""
    from runtime.backends import connect

    return connect(spec, **options)


def context_limit(backend: Backend) -> int:
    """Tokens one prompt + output may span on `backend`: the embedded engine's limit, or what an
    SGLang-style server reports (`max_req_input_len`, `max_total_num_tokens`: a real SGLang refuses
    longer inputs, so a head past them would fail every request); else the model's window."""
    while isinstance(backend, WrappedBackend):
        backend = backend.inner
    engine = getattr(backend, "engine", None)
    if engine is not None:
        limit = int(getattr(engine, "context_length", DEFAULT_CONTEXT))
        pool = getattr(getattr(engine, "pool", None), "size", None)
        return min(limit, int(pool)) if pool else limit
    return _server_limit(backend) or DEFAULT_CONTEXT


def _server_limit(backend: Backend) -> int | None:
    info_of = getattr(backend, "server_info", None)
    if info_of is None:
        return None
    try:
        info = info_of()
    except Exception:  # noqa: BLE001 - a server without the endpoint keeps the default
        return None
    inner = info.get("internal_states")
    states = [info, *(inner if isinstance(inner, list) else [inner] if isinstance(inner, dict) else [])]
    limits = [int(v) for st in states for key in ("max_req_input_len", "max_total_num_tokens")
              if isinstance(v := st.get(key), int) and v > 0]  # fmt: skip
    return min(limits) if limits else None


def count_tokens(backend: Backend, text: str) -> int:
    """Tokens of `text` on the backend's tokenizer; ~4 characters a token when it cannot tokenize."""
    try:
        return len(backend.tokenize(text))
    except Exception:  # noqa: BLE001 - any backend that cannot tokenize gets the estimate
        return math.ceil(len(text) / 4)


class JsonlSink:
    """Appends one JSON object per line and flushes it at once: a partial run keeps its lines."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._file: TextIO = path.open("w", encoding="utf-8")

    def write(self, row: dict[str, Any]) -> None:
        with self._lock:
            self._file.write(json.dumps(row, ensure_ascii=False) + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100) of `values`; None when there are none."""
    data = sorted(values)
    if not data:
        return None
    pos = (len(data) - 1) * q / 100
    low, high = math.floor(pos), math.ceil(pos)
    return data[low] + (data[high] - data[low]) * (pos - low)


def hit_rate(records: Sequence[Any]) -> float:
    """cached / prompt tokens over trace records (0.0 when nothing was sent)."""
    prompt = sum(r.prompt_tokens for r in records)
    return sum(r.cached_tokens for r in records) / prompt if prompt else 0.0


@contextmanager
def progress_bar(enabled: bool, description: str, total: int) -> Iterator[Any]:
    """A rich progress bar (a callable `advance()`), or a no-op when disabled."""
    if not enabled:
        yield lambda: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task(description, total=total)
        yield lambda: bar.advance(task)


def fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"
