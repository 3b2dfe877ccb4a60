"""The one interface the agent talks to, whatever runs the model.

A backend turns a prompt (text or token ids) into a `Completion` that says how many prompt
tokens the serving cache already held. Implementations: embedded (in-process Engine),
sglang (native /generate over HTTP), openai (any OpenAI-compatible /v1/completions).
The agent builds one `GenerationRequest` per call and hands it to `complete`; `generate` is the
keyword form for people (and for backends written against it, which `complete` then runs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from runtime.engine.generation import GenerationRequest

SessionEventKind = Literal["open", "tool_wait", "resume", "abandon", "close"]
#: why a call ended: SGLang's finish types, and OpenAI's for a server that parsed a call or filtered
FinishReason = Literal["stop", "length", "abort", "tool_calls", "content_filter"]
_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "abort": "abort",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "content_filter": "content_filter",
}


def finish_of(wire: object) -> FinishReason:
    """A server's finish reason (SGLang's `{"type": ...}` dict or OpenAI's string) as our type.
    A server that names none, or one of its own, ended the text itself: "stop"."""
    name = wire.get("type") if isinstance(wire, dict) else wire
    return _FINISH.get(str(name), "stop")


@dataclass(frozen=True, slots=True)
class Completion:
    """One model call's result, backend-independent."""

    text: str
    output_ids: list[int]
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    finish_reason: FinishReason
    ttft_s: float
    latency_s: float
    request_id: str = ""
    #: the server's own report as it came (meta_info or usage), for display; the fields below are
    #: what the agent reads from it
    meta: dict[str, object] = field(default_factory=dict)
    #: prompt tokens past `cached_tokens` the server's cache held and evicted (ours reports it;
    #: None where the server does not say, and the ledger infers eviction)
    evicted_tokens: int | None = None
    #: False when the server says it did not read its cache for this call (prefix_cache: false)
    prefix_cache: bool = True
    #: the worker that served the call, where a cluster says (meta_info.worker_id)
    worker_id: str | None = None


def generate_by_keywords(
    generate: Callable[..., Completion], request: GenerationRequest, name: str
) -> Completion:
    """Run `request` through a backend's keyword form (`generate(prompt, input_ids, sampling_params,
    session_id=..., cache_salt=..., priority=..., prefix_cache=..., rid=...)`)."""
    if not isinstance(request.cache_salt, str | None):  # never run a namespaced request unsalted
        from runtime.errors import BackendError

        raise BackendError(f"backend {name!r} takes cache_salt as one string", status=400)
    return generate(
        request.prompt,
        list(request.input_ids) if request.input_ids is not None else None,
        dict(request.sampling_params),
        session_id=request.session_id,
        cache_salt=request.cache_salt,
        priority=request.priority,
        prefix_cache=request.prefix_cache,
        rid=request.rid,
    )


class Backend:
    """What `Agent` needs from a model server. Safe to share between threads and agents."""

    name: str = "backend"
    #: True when `generate(input_ids=...)` is accepted (token-exact prompts).
    supports_input_ids: bool = False

    @property
    def can_tokenize(self) -> bool:
        """True when `tokenize` / `decode` work: callers check this instead of trying and catching."""
        return False

    def generate(
        self,
        prompt: str | None = None,
        input_ids: list[int] | None = None,
        sampling_params: dict[str, Any] | None = None,
        *,
        session_id: str | None = None,
        cache_salt: str | None = None,
        priority: int | None = None,
        prefix_cache: bool = True,
        rid: str | None = None,
    ) -> Completion:
        """Run one request. Raises `BackendError` (4xx at once; transient errors after retries).
        The one keyword form: it builds the `GenerationRequest` that `complete` carries on."""
        from runtime.errors import BackendError, InvalidRequest

        try:
            request = GenerationRequest.of(
                prompt,
                input_ids,
                sampling_params,
                session_id=session_id,
                cache_salt=cache_salt,
                priority=priority,
                prefix_cache=prefix_cache,
                rid=rid,
            )
        except InvalidRequest as exc:
            raise BackendError(f"InvalidRequest: {exc}", status=400) from exc
        return self.complete(request)

    def complete(self, request: GenerationRequest) -> Completion:
        """Run one built request: what each backend implements, and what the agent calls. A
        backend written against the keyword form (`generate` only) is run through it."""
        if type(self).generate is Backend.generate:
            raise NotImplementedError(f"backend {self.name!r} implements neither complete nor generate")
        return generate_by_keywords(self.generate, request, self.name)

    def tokenize(self, text: str) -> list[int]:
        """Token ids of `text` as the server's tokenizer sees it (no special tokens added).

        Raises `BackendError` when the backend cannot tokenize (`can_tokenize` is False).
        """
        from runtime.errors import BackendError

        raise BackendError(f"backend {self.name!r} cannot tokenize")

    def decode(self, ids: list[int]) -> str:
        from runtime.errors import BackendError

        raise BackendError(f"backend {self.name!r} cannot detokenize")

    def session_event(self, session_id: str, event: SessionEventKind, **info: object) -> None:  # noqa: B027
        """Tell the cache about an agent session (see docs/sessions.md).

        Backends whose server has no session-aware cache ignore events.
        """

    def flush_cache(self) -> bool:
        """Empty the server's prefix cache; False when the backend cannot."""
        return False

    def close(self) -> None:  # noqa: B027
        """Release connections; the backend is unusable afterwards."""


class WrappedBackend(Backend):
    """Base for backends that wrap another one (cache control, recording): everything but
    `generate` goes to `inner`. Subclasses own `inner` unless they override `close`."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.name = inner.name
        self.supports_input_ids = inner.supports_input_ids

    @property
    def can_tokenize(self) -> bool:
        return self.inner.can_tokenize

    def tokenize(self, text: str) -> list[int]:
        return self.inner.tokenize(text)

    def decode(self, ids: list[int]) -> str:
        return self.inner.decode(ids)

    def session_event(self, session_id: str, event: SessionEventKind, **info: object) -> None:
        self.inner.session_event(session_id, event, **info)

    def flush_cache(self) -> bool:
        return self.inner.flush_cache()

    def close(self) -> None:
        self.inner.close()
