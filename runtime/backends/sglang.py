"""SGLang-native backend: POST /generate over HTTP (works with `radixagent serve` and real SGLang).

Requests stream (`stream: true`) so that TTFT is the arrival time of the first chunk; the last
chunk carries the full text (SGLang streams cumulative text) and `meta_info.cached_tokens`.

Session affinity behind SGLang's router: a request with a `session_id` carries it in the
`X-SMG-Routing-Key` header, which smg (`--routing-key-override`, on any policy) or sglang-router
(`manual` policy) maps to one worker for the session's life; servers ignore it. See docs/cluster.md.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Iterator
from typing import Any

import httpx

from runtime.backends.base import Backend, Completion, SessionEventKind
from runtime.backends.embedded import completion_from_output
from runtime.backends.retry import server_message, status_error, transport_error, with_retries
from runtime.engine.generation import GenerationRequest
from runtime.errors import BackendError

#: where an event stream's lines end (the SSE spec's three line endings, and nothing else)
_LINE_END = re.compile(rb"\r\n|\n|\r")

#: sglang-router (>= 0.3) header that pins requests with the same value to one worker
ROUTING_KEY_HEADER = "X-SMG-Routing-Key"


class SGLangBackend(Backend):
    name = "sglang"
    supports_input_ids = True

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        max_attempts: int = 4,
        retry_backoff_s: float = 0.5,
        stream: bool = True,
        routing_key_header: str | None = ROUTING_KEY_HEADER,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.max_attempts, self.retry_backoff_s = max_attempts, retry_backoff_s
        self.stream = stream
        self.routing_key_header = routing_key_header
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        self.client = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)
        self._has_tokenize: bool | None = None
        self._has_session_events = True

    # ---- generation ---------------------------------------------------------------------
    def complete(self, request: GenerationRequest) -> Completion:
        payload = build_payload(request)
        payload["stream"] = self.stream
        headers = self._routing_headers(request.session_id)
        run = self._generate_stream if self.stream else self._generate_once
        return with_retries(lambda: run(payload, headers), self.max_attempts, self.retry_backoff_s)

    def _routing_headers(self, session_id: str | None) -> dict[str, str]:
        """The router's session-affinity header; none for session-less requests (cache-aware routing)."""
        if session_id and self.routing_key_header:
            return {self.routing_key_header: session_id}
        return {}

    def _generate_once(self, payload: dict[str, object], headers: dict[str, str]) -> Completion:
        started = time.perf_counter()
        out = self._json("POST", "/generate", payload, headers)
        return completion_from_output(out, time.perf_counter() - started)

    def _generate_stream(self, payload: dict[str, object], headers: dict[str, str]) -> Completion:
        started = time.perf_counter()
        first: float | None = None
        last: dict[str, Any] | None = None
        try:
            with self.client.stream("POST", "/generate", json=payload, headers=headers) as resp:
                if resp.status_code != 200:
                    raise status_error(
                        resp.status_code, resp.read().decode(errors="replace"), self._url("/generate")
                    )
                for event in _sse_events(_event_lines(resp.iter_bytes())):
                    if "error" in event:
                        err = event["error"]
                        status = int(err.get("code", 400)) if isinstance(err, dict) else 400
                        raise BackendError(
                            server_message(json.dumps(event)), status=status, retryable=status >= 500
                        )
                    if first is None:
                        first = time.perf_counter() - started
                    last = event
        except httpx.HTTPError as exc:
            raise transport_error(exc, self._url("/generate")) from exc
        if last is None or not (last.get("meta_info") or {}).get("finish_reason"):
            # the connection closed before the final chunk (which carries finish_reason): a
            # partial text is not an answer
            raise BackendError("stream ended before its final chunk", status=None, retryable=True)
        latency = time.perf_counter() - started
        return completion_from_output(last, latency, ttft_s=first if first is not None else latency)

    # ---- helpers used by the agent --------------------------------------------------------
    @property
    def can_tokenize(self) -> bool:
        """Our server and SGLang's have /tokenize; an OpenAI-style server behind this URL may not:
        the first question asks the server once (404/405: no), later ones read the answer."""
        if self._has_tokenize is None:
            try:
                self.tokenize("")
            except BackendError:
                return False  # not remembered: a server still starting up may answer later
        return bool(self._has_tokenize)

    def tokenize(self, text: str) -> list[int]:
        if self._has_tokenize is False:
            return super().tokenize(text)
        try:
            out = self._json("POST", "/tokenize", {"prompt": text, "add_special_tokens": False})
        except BackendError as exc:
            if exc.status in (404, 405):
                self._has_tokenize = False
                return super().tokenize(text)
            raise
        self._has_tokenize = True
        return list(out["tokens"])

    def decode(self, ids: list[int]) -> str:
        out = self._json("POST", "/detokenize", {"tokens": list(ids)})
        return str(out["text"])

    def session_event(self, session_id: str, event: SessionEventKind, **info: object) -> None:
        """POST /session_event; a server without it (real SGLang) is remembered and skipped."""
        if not self._has_session_events:
            return
        try:
            self._json("POST", "/session_event", {"session_id": session_id, "event": event, **info})
        except BackendError as exc:
            if exc.status not in (404, 405):
                raise
            self._has_session_events = False

    def flush_cache(self) -> bool:
        try:
            resp = self.client.post("/flush_cache")
        except httpx.HTTPError:
            return False
        return resp.status_code == 200

    def model_info(self) -> dict[str, Any]:
        return self._json("GET", "/get_model_info", None)

    def server_info(self) -> dict[str, Any]:
        """GET /get_server_info: SGLang's (and our server's) limits, e.g. `max_req_input_len`."""
        return self._json("GET", "/get_server_info", None)

    def close(self) -> None:
        self.client.close()

    # ---- plumbing -----------------------------------------------------------------------------
    def _url(self, path: str) -> str:
        return self.base_url + path

    def _json(
        self, method: str, path: str, payload: dict[str, object] | None, headers: dict[str, str] | None = None
    ) -> Any:
        def once() -> Any:
            try:
                resp = self.client.request(method, path, json=payload, headers=headers)
            except httpx.HTTPError as exc:
                raise transport_error(exc, self._url(path)) from exc
            if resp.status_code != 200:
                raise status_error(resp.status_code, resp.text, self._url(path))
            return resp.json()

        return with_retries(once, self.max_attempts, self.retry_backoff_s)


def build_payload(request: GenerationRequest) -> dict[str, object]:
    """SGLang's /generate body. `seed` travels as SGLang's `sampling_seed`; unset fields are left out."""
    params = {k: v for k, v in request.sampling_params.items() if v is not None}
    if "seed" in params:
        params["sampling_seed"] = params.pop("seed")
    payload: dict[str, object] = {"sampling_params": params}
    if request.prompt is not None:
        payload["text"] = request.prompt
    else:
        payload["input_ids"] = list(request.input_ids or ())
    optional = {
        "session_id": request.session_id,
        "cache_salt": request.cache_salt,
        "priority": request.priority,
        "rid": request.rid,
    }
    payload.update({k: v for k, v in optional.items() if v is not None})
    payload.update(request.logprobs.as_kwargs())
    if not request.prefix_cache:
        payload["prefix_cache"] = False  # our extension; SGLang ignores unknown top-level keys
    return payload


def _event_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """An event stream's lines, cut where SSE cuts them (CR LF, LF or CR). httpx's `iter_lines`
    also cuts at U+2028, U+2029 and U+0085, which JSON leaves raw inside strings and SGLang's
    orjson writes as they are: generated text holding one split its event in two."""
    rest = b""
    for chunk in chunks:
        *lines, rest = _LINE_END.split(rest + chunk)
        yield from (line.decode() for line in lines)
    if rest:
        yield rest.decode()


def _sse_events(lines: Iterable[str]) -> Iterator[Any]:
    """Parsed `data: {json}` events up to `data: [DONE]`."""
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        if data:
            yield json.loads(data)
