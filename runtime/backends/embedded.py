"""In-process backend: the embedded `Engine`, no HTTP. Token-exact prompts are supported."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from runtime.backends.base import Backend, Completion, SessionEventKind, finish_of
from runtime.engine.generation import GenerationRequest
from runtime.errors import BackendError, EngineClosed, InvalidRequest, Overloaded, PoolExhausted

if TYPE_CHECKING:
    from runtime.engine.engine import Engine


def completion_from_output(out: dict[str, Any], latency_s: float, ttft_s: float | None = None) -> Completion:
    """A `Completion` from SGLang's `{text, output_ids, meta_info}` shape (engine or native HTTP)."""
    meta = dict(out.get("meta_info") or {})
    evicted, worker = meta.get("evicted_prefix_tokens"), meta.get("worker_id")
    ttft = ttft_s if ttft_s is not None else float(meta.get("ttft") or latency_s)
    return Completion(
        text=str(out.get("text", "")),
        output_ids=list(out.get("output_ids") or []),
        prompt_tokens=int(meta.get("prompt_tokens", 0)),
        cached_tokens=int(meta.get("cached_tokens") or 0),
        completion_tokens=int(meta.get("completion_tokens", 0)),
        finish_reason=finish_of(meta.get("finish_reason")),
        ttft_s=ttft,
        latency_s=latency_s,
        request_id=str(meta.get("id", "")),
        meta=meta,
        evicted_tokens=evicted if isinstance(evicted, int) else None,
        prefix_cache=meta.get("prefix_cache") is not False,
        worker_id=None if worker is None else str(worker),
    )


def as_backend_error(exc: Exception) -> BackendError:
    """Engine errors as the HTTP server would report them (same status, same message)."""
    message = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, InvalidRequest):
        return BackendError(message, status=400)
    if isinstance(exc, (Overloaded, PoolExhausted, EngineClosed)):
        return BackendError(message, status=503, retryable=not isinstance(exc, EngineClosed))
    return BackendError(message)


class EmbeddedBackend(Backend):
    """Wraps an `Engine` (given, or built from `engine_options` and then owned and shut down by `close`)."""

    name = "embedded"
    supports_input_ids = True

    @property
    def can_tokenize(self) -> bool:
        return True

    def __init__(self, engine: Engine | None = None, **engine_options: Any) -> None:
        self._owns_engine = engine is None
        if engine is None:
            from runtime.engine.engine import Engine

            engine = Engine(**engine_options)
        elif engine_options:
            raise TypeError(f"engine options given with an engine instance: {sorted(engine_options)}")
        self.engine = engine

    def complete(self, request: GenerationRequest) -> Completion:
        started = time.perf_counter()
        try:
            (out,) = self.engine.run([request])
        except (InvalidRequest, Overloaded, PoolExhausted, EngineClosed) as exc:
            raise as_backend_error(exc) from exc
        return completion_from_output(out, time.perf_counter() - started)

    def tokenize(self, text: str) -> list[int]:
        return list(self.engine.tokenize(text))

    def decode(self, ids: list[int]) -> str:
        return self.engine.decode(ids)

    def session_event(self, session_id: str, event: SessionEventKind, **info: object) -> None:
        try:
            self.engine.session_event(session_id, event, **info)
        except InvalidRequest as exc:
            raise as_backend_error(exc) from exc

    def flush_cache(self) -> bool:
        return bool(self.engine.flush_cache())

    def close(self) -> None:
        if self._owns_engine:
            self.engine.shutdown()
