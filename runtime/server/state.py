"""What every route shares: the engine bridge, the server config, metrics, and request checks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runtime.cache.namespace import Salt, split_salt
from runtime.engine.generation import GenerationRequest
from runtime.errors import UnknownSession
from runtime.server.args import ServerArgs
from runtime.server.bridge import EngineBridge
from runtime.server.errors import ApiError
from runtime.server.metrics import ServerMetrics

if TYPE_CHECKING:
    from runtime.engine.engine import Engine


@dataclass(slots=True)
class ServerState:
    engine: Engine
    args: ServerArgs
    bridge: EngineBridge
    metrics: ServerMetrics | None
    model_name: str
    model_path: str
    weight_version: str = "default"  # SGLang's /model_info field; set by /update_weights_from_disk

    @classmethod
    def build(cls, engine: Engine, args: ServerArgs) -> ServerState:
        info = engine.info()
        model_path = info.model_path or "default"
        name = args.served_model_name or info.served_model_name or model_path
        metrics = ServerMetrics(engine, str(name)) if args.enable_metrics else None
        bridge = EngineBridge(engine, args.max_threads)
        if args.trace_dir is not None:  # issue 19: traces of named sessions
            from runtime.server.trace_dir import tracing_bridge

            bridge = tracing_bridge(engine, args)
        return cls(engine, args, bridge, metrics, str(name), model_path)

    def requests(
        self,
        *,
        prompt: str | list[str] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        sampling: Mapping[str, object] | Sequence[Mapping[str, object]],
        cache_salt: Salt,
        session_id: str | None,
        priority: int | None,
        prefix_cache: bool,
        rid: str | list[str],
        logprobs: Mapping[str, object] | None = None,
    ) -> list[GenerationRequest]:
        """The engine requests of one route call, one per prompt in order, built here once and run
        as built (`EngineBridge.generate` / `open_stream`). `logprobs`: SGLang's logprob arguments
        (each one value or one per prompt); `rid` and `sampling` likewise.

        Raises `ApiError` (400) for what only the server checks and `InvalidRequest` (400) for a
        field of the wrong shape; the engine checks the values (sampling, vocabulary, length) once,
        before anything reaches the model.
        """
        if self.args.require_cache_salt and not split_salt(cache_salt)[0]:  # extra_key is no tenant
            raise ApiError(400, "cache_salt is required by this server (--require-cache-salt)")
        if prompt is not None and isinstance(prompt, list) and not prompt:
            raise ApiError(400, "text/prompt: empty batch")
        if input_ids is not None and not input_ids:
            raise ApiError(400, "input_ids: must not be empty")
        per_prompt = sampling if isinstance(sampling, Mapping) else list(sampling)
        return GenerationRequest.batch(
            prompt=prompt,
            input_ids=input_ids if prompt is None else None,
            sampling_params=per_prompt,
            cache_salt=cache_salt,
            rid=rid,
            prefix_cache=prefix_cache,
            session_id=session_id,
            priority=priority,
            **(logprobs or {}),
        )

    def check_session_params(
        self, session_params: Mapping[str, object] | None, cache_salt: Salt = None
    ) -> str | None:
        """SGLang's `session_params.id` must name an open session of this salt (unlike a top-level
        `session_id`, which opens its session on first use). Returns the id."""
        sid = (session_params or {}).get("id")
        if sid is None:
            return None
        if not isinstance(sid, str):
            raise ApiError(400, "session_params.id: must be a string")
        if not self.engine.session_is_open(sid, split_salt(cache_salt)[0] or None):
            raise UnknownSession(f"session {sid!r} is not open (open it with /open_session)")
        return sid

    def observe(
        self, endpoint: str, outputs: dict[str, Any] | list[dict[str, Any]], stream: bool = False
    ) -> None:
        if self.args.worker_id is not None:  # issue 19: which worker served it (routing misses)
            for out in outputs if isinstance(outputs, list) else [outputs]:
                out.setdefault("meta_info", {})["worker_id"] = self.args.worker_id
        if self.metrics is None:
            return
        for out in outputs if isinstance(outputs, list) else [outputs]:
            self.metrics.observe(endpoint, out.get("meta_info", {}), stream)


def join_salt(cache_salt: str | None, extra_key: str | None) -> Salt:
    """SGLang namespaces the cache by both `cache_salt` and `extra_key`; the engine keys the tree by
    a digest of the pair (runtime/cache/namespace.py), never by a plain join."""
    return (cache_salt, extra_key) if extra_key else cache_salt
