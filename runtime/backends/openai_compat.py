"""OpenAI-compatible backend: /v1/completions through the `openai` package (vLLM, SGLang, ...).

Text prompts only. Streams with `stream_options.include_usage` so that TTFT is measured and the
final usage chunk gives `prompt_tokens_details.cached_tokens` (servers report it when prefix-cache
reporting is on; a missing or null value counts as 0). Sampling keys OpenAI lacks (top_k, min_p,
json_schema, regex, ...) and the cache fields (cache_salt, session_id, priority, rid) travel in
`extra_body`, which SGLang and vLLM read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import openai
from openai.types import CompletionUsage

from runtime.backends.base import Backend, Completion, finish_of
from runtime.backends.retry import with_retries
from runtime.engine.generation import GenerationRequest
from runtime.errors import BackendError

_T = TypeVar("_T")

_OPENAI_KEYS = {"temperature": "temperature", "top_p": "top_p", "stop": "stop", "seed": "seed"}


class OpenAIBackend(Backend):
    name = "openai"
    supports_input_ids = False

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        model: str | None = None,
        timeout_s: float = 600.0,
        max_attempts: int = 4,
        retry_backoff_s: float = 0.5,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        self.max_attempts, self.retry_backoff_s = max_attempts, retry_backoff_s
        self.client = openai.OpenAI(
            base_url=self.base_url, api_key=api_key or "EMPTY", timeout=timeout_s, max_retries=0
        )
        self._model = model

    @property
    def model(self) -> str:
        """The model name: as given, else the server's first model (asked once)."""
        if self._model is None:
            models = self._call(lambda: list(self.client.models.list()))
            if not models:
                raise BackendError(f"{self.base_url}/models lists no model")
            self._model = models[0].id
        return self._model

    def complete(self, request: GenerationRequest) -> Completion:
        prompt = request.prompt
        if prompt is None:
            raise BackendError("the openai backend takes text prompts only (supports_input_ids is False)")
        kwargs = completion_kwargs(request)
        model = self.model
        return self._call(lambda: self._stream(model, prompt, kwargs))

    def _stream(self, model: str, prompt: str, kwargs: dict[str, Any]) -> Completion:
        started = time.perf_counter()
        first: float | None = None
        parts: list[str] = []
        finish, usage, request_id = None, None, ""
        stream = self.client.completions.create(
            model=model, prompt=prompt, stream=True, stream_options={"include_usage": True}, **kwargs
        )
        with stream:
            for chunk in stream:
                request_id = chunk.id or request_id
                usage = chunk.usage or usage
                for choice in chunk.choices:
                    if choice.text:
                        first = first if first is not None else time.perf_counter() - started
                        parts.append(choice.text)
                    finish = choice.finish_reason or finish
        if finish is None:  # the stream closed before the choice's last chunk: not an answer
            raise BackendError(f"{self.base_url}: stream ended before its final chunk", retryable=True)
        latency = time.perf_counter() - started
        return _completion(
            "".join(parts), usage, finish, first if first is not None else latency, latency, request_id
        )

    def _call(self, fn: Callable[[], _T]) -> _T:
        def once() -> _T:
            try:
                return fn()
            except openai.APIStatusError as exc:
                raise BackendError(
                    _message(exc), status=exc.status_code, retryable=exc.status_code >= 500
                ) from exc
            except (openai.APIConnectionError, openai.APITimeoutError) as exc:
                raise BackendError(f"{self.base_url}: {type(exc).__name__}: {exc}", retryable=True) from exc

        return with_retries(once, self.max_attempts, self.retry_backoff_s)

    def close(self) -> None:
        self.client.close()


def completion_kwargs(request: GenerationRequest) -> dict[str, Any]:
    """`completions.create` keyword arguments from SGLang-style sampling params."""
    params = {k: v for k, v in request.sampling_params.items() if v is not None}
    kwargs: dict[str, Any] = {"max_tokens": params.pop("max_new_tokens", 128)}
    for ours, theirs in _OPENAI_KEYS.items():
        if ours in params:
            kwargs[theirs] = params.pop(ours)
    extra = dict(params)
    cache = {
        "session_id": request.session_id,
        "cache_salt": request.cache_salt,
        "priority": request.priority,
        "rid": request.rid,
    }
    extra.update({k: v for k, v in cache.items() if v is not None})
    if not request.prefix_cache:
        extra["prefix_cache"] = False
    if extra:
        kwargs["extra_body"] = extra
    return kwargs


def _completion(
    text: str, usage: CompletionUsage | None, finish: str, ttft: float, latency: float, request_id: str
) -> Completion:
    prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
    completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
    details = getattr(usage, "prompt_tokens_details", None)
    cached = int(getattr(details, "cached_tokens", 0) or 0)
    return Completion(
        text=text,
        output_ids=[],
        prompt_tokens=prompt_tokens,
        cached_tokens=cached,
        completion_tokens=completion_tokens,
        finish_reason=finish_of(finish),
        ttft_s=ttft,
        latency_s=latency,
        request_id=request_id,
        meta={"usage": usage.model_dump() if usage is not None else None},
    )


def _message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and "message" in err:
            return f"{exc.status_code}: {err['message']}"
    return f"{exc.status_code}: {exc.message}"
