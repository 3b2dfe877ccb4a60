"""How the task runners use a backend: opening one, greedy sampling, the prefix-cache switch, and
the token budget of a prompt."""

from __future__ import annotations

import math
from typing import Any

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

    def generate(
        self,
        prompt: str | None = None,
        input_ids: list[int] | None = None,
        sampling_params: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Completion:
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
    limits = [
        int(v)
        for st in states
        for key in ("max_req_input_len", "max_total_num_tokens")
        if isinstance(v := st.get(key), int) and v > 0
    ]
    return min(limits) if limits else None


def count_tokens(backend: Backend, text: str) -> int:
    """Tokens of `text` on the backend's tokenizer; ~4 characters a token when it cannot tokenize."""
    if backend.can_tokenize:
        return len(backend.tokenize(text))
    return math.ceil(len(text) / 4)
