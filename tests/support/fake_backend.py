"""A scripted, function-backed Backend for agent tests (no model).

It tokenizes with a tiny deterministic tokenizer (words, single whitespace/punctuation chars,
ChatML specials) and simulates a token-level prefix cache (unbounded radix trie per
cache_salt; at most len-1 prompt tokens matched, as SGLang does), so `cached_tokens` means
what it means on a real server. The "model" is a function of the call.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.backends.base import Backend, Completion
from runtime.engine.generation import GenerationRequest
from runtime.errors import BackendError

IM_START, IM_END = "<|im_start|>", "<|im_end|>"


class FakeTokenizer:
    _pattern = re.compile(r"<\|im_start\|>|<\|im_end\|>|\w+|\s|[^\w\s]")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: dict[str, int] = {IM_START: 1, IM_END: 2}
        self._words: dict[int, str] = {1: IM_START, 2: IM_END}

    def encode(self, text: str) -> list[int]:
        out = []
        with self._lock:
            for word in self._pattern.findall(text):
                if word not in self._ids:
                    self._ids[word] = len(self._ids) + 1
                    self._words[self._ids[word]] = word
                out.append(self._ids[word])
        return out

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self._words[i] for i in ids)


class PrefixCacheSim:
    """Unbounded token trie per salt: match = longest cached prefix, capped at len-1."""

    def __init__(self) -> None:
        self._roots: dict[str | None, dict] = {}

    def match(self, salt: str | None, ids: Sequence[int]) -> int:
        node, depth = self._roots.get(salt, {}), 0
        for token in ids[: max(len(ids) - 1, 0)]:
            if token not in node:
                break
            node, depth = node[token], depth + 1
        return depth

    def insert(self, salt: str | None, ids: Sequence[int]) -> None:
        node = self._roots.setdefault(salt, {})
        for token in ids:
            node = node.setdefault(token, {})


@dataclass(slots=True)
class FakeCall:
    index: int
    prompt: str  # the prompt as text (decoded from ids in token mode)
    input_ids: list[int]
    sampling_params: dict[str, Any]
    session_id: str | None
    cached_tokens: int = 0
    output: str = ""


Script = Callable[[FakeCall], str]


@dataclass
class FakeBackend(Backend):
    """`script`: a function of the call, or a list of outputs returned in order (then repeated last)."""

    script: Script | Sequence[str]
    supports_input_ids: bool = True
    can_tokenize: bool = True
    eos_in_output: bool = True  # like SGLang: output_ids end with the stop token <|im_end|>
    zero_new_tokens_ok: bool = True
    name: str = "fake"
    calls: list[FakeCall] = field(default_factory=list)
    events: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    tokenizer: FakeTokenizer = field(default_factory=FakeTokenizer)
    cache: PrefixCacheSim = field(default_factory=PrefixCacheSim)
    cache_enabled: bool = True

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def tokenize(self, text: str) -> list[int]:
        if not self.can_tokenize:
            raise BackendError("fake backend: tokenize disabled")
        return self.tokenizer.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def session_event(self, session_id: str, event: Any, **info: Any) -> None:
        with self._lock:
            self.events.append((session_id, event, info))

    def _output(self, call: FakeCall) -> str:
        if callable(self.script):
            return self.script(call)
        outputs = list(self.script)
        return outputs[min(call.index, len(outputs) - 1)]

    def generate(
        self,
        prompt=None,
        input_ids=None,
        sampling_params=None,
        *,
        session_id=None,
        cache_salt=None,
        priority=None,
        prefix_cache=True,
        rid=None,
    ) -> Completion:
        params = dict(sampling_params or {})
        if input_ids is not None and not self.supports_input_ids:
            raise BackendError("fake backend: input_ids not supported", status=400)
        _check_params(params)
        ids = list(input_ids) if input_ids is not None else self.tokenizer.encode(prompt or "")
        max_new = int(params.get("max_new_tokens", 128))
        if max_new == 0 and not self.zero_new_tokens_ok:
            raise BackendError("max_new_tokens must be >= 1", status=400)
        with self._lock:
            call = FakeCall(len(self.calls), self.tokenizer.decode(ids), ids, params, session_id)
            self.calls.append(call)
            use_cache = prefix_cache and self.cache_enabled
            call.cached_tokens = self.cache.match(cache_salt, ids) if use_cache else 0
        text = self._output(call) if max_new > 0 else ""  # may raise BackendError: a model failure
        out_ids, text, stopped = self._stop(self.tokenizer.encode(text)[:max_new], params)
        finish = "stop" if stopped or not (max_new and len(out_ids) >= max_new) else "length"
        if self.eos_in_output and finish == "stop" and not stopped and max_new > 0:
            out_ids = [*out_ids, 2]
        call.output = text
        with self._lock:
            if use_cache:
                self.cache.insert(cache_salt, ids + out_ids)
        return Completion(
            text=text,
            output_ids=out_ids,
            prompt_tokens=len(ids),
            cached_tokens=call.cached_tokens,
            completion_tokens=len(out_ids),
            finish_reason=finish,
            ttft_s=0.001,
            latency_s=0.002,
            request_id=rid or f"fake-{call.index}",
        )

    def _stop(self, out_ids: list[int], params: dict[str, Any]) -> tuple[list[int], str, bool]:
        """(ids, text, stopped) after SGLang's stop rules: a stop token ends the output (kept in the
        ids, not in the text); a stop string cuts the text before it (the ids up to its token)."""
        stop_ids = set(params.get("stop_token_ids") or ())
        for k, token in enumerate(out_ids):
            if token in stop_ids:
                return out_ids[: k + 1], self.tokenizer.decode(out_ids[:k]), True
        stops = params.get("stop") or []
        stops = [stops] if isinstance(stops, str) else list(stops)
        for k in range(1, len(out_ids) + 1):
            text = self.tokenizer.decode(out_ids[:k])
            cuts = [text.find(s) for s in stops if s in text]
            if cuts:
                return out_ids[:k], text[: min(cuts)], True
        return out_ids, self.tokenizer.decode(out_ids), False


def _check_params(params: dict[str, Any]) -> None:
    """The bad values every real backend answers with a 400 naming the field."""
    max_new = params.get("max_new_tokens", 128)
    if not isinstance(max_new, int) or max_new < 0:
        raise BackendError(f"max_new_tokens must be an integer >= 0, got {max_new!r}", status=400)
    temperature = params.get("temperature", 1.0)
    if not isinstance(temperature, int | float) or temperature < 0:
        raise BackendError(f"temperature must be >= 0, got {temperature!r}", status=400)


def last_user_message(prompt: str) -> str:
    """Content of the last user turn in a ChatML prompt."""
    start = prompt.rfind(IM_START + "user\n")
    if start < 0:
        return ""
    body = prompt[start + len(IM_START + "user\n") :]
    return body.split(IM_END, 1)[0]


def arithmetic_model(call: FakeCall) -> str:
    """A tiny scripted 'model': add the two numbers of the task with the tool, then answer."""
    message = last_user_message(call.prompt)
    if message.startswith("Reflect"):
        return '{"thought":"check the tool result and answer"}'
    if message.startswith("Observation"):
        value = message.split(": ", 1)[1].split("\n")[0]
        return '{"answer":"' + value + '"}'
    numbers = re.findall(r"\d+", message)
    if "Error" in message or len(numbers) < 2:
        return '{"answer":"unknown"}'
    return json.dumps(
        {"tool": "add", "arguments": {"a": int(numbers[-2]), "b": int(numbers[-1])}}, separators=(",", ":")
    )


class ReplyBackend(Backend):
    """Text-mode fake without a tokenizer (the agent then lays prompts out as text): `reply(prompt,
    sampling_params)` is the model's output. Every call is recorded with the request's fields.
    A JSON-mode reply that does not close its object ran out of tokens (`finish_reason` length).
    A token is 4 characters of text.

    `cache=True` simulates a server's prefix cache over the text: a request that reads the cache
    (`prefix_cache`) finds the longest prefix of its prompt that an earlier prompt plus its reply
    began with (at most all but one token); `flush_cache` empties it. `prefill_s_per_token`: what
    each prompt token not found in the cache adds to the TTFT (0.01 s without any)."""

    name = "reply"

    def __init__(
        self,
        reply: Callable[[str, dict[str, Any]], str],
        *,
        cache: bool = False,
        prefill_s_per_token: float = 0.0,
    ) -> None:
        self.reply = reply
        self.calls: list[dict[str, Any]] = []
        self.cache = cache
        self.prefill_s_per_token = prefill_s_per_token
        self.cached_texts: list[str] = []  # what the simulated cache holds (prompt + reply)
        self.flushes = 0

    @classmethod
    def replaying(cls, outputs: Sequence[str]) -> ReplyBackend:
        """Answers with `outputs` in order, one per call."""
        queue = list(outputs)
        return cls(lambda _prompt, _params: queue.pop(0))

    @property
    def params(self) -> list[dict[str, Any]]:
        return [c["params"] for c in self.calls]

    def complete(self, request: GenerationRequest) -> Completion:
        params, prompt = dict(request.sampling_params), request.prompt or ""
        self.calls.append(
            {
                "prompt": request.prompt,
                "params": params,
                "session_id": request.session_id,
                "cache_salt": request.cache_salt,
                "priority": request.priority,
                "prefix_cache": request.prefix_cache,
                "rid": request.rid,
            }
        )
        prompt_tokens = len(prompt) // 4
        use_cache = self.cache and request.prefix_cache
        cached = min(self._cached_chars(prompt) // 4, max(prompt_tokens - 1, 0)) if use_cache else 0
        text = "" if params.get("max_new_tokens") == 0 else self.reply(prompt, params)
        if use_cache:
            self.cached_texts.append(prompt + text)
        cut = "json_schema" in params and bool(text) and not text.endswith("}")
        ttft = 0.01 + self.prefill_s_per_token * (prompt_tokens - cached)
        return Completion(
            text, [], prompt_tokens, cached, len(text) // 4, "length" if cut else "stop", ttft, ttft + 0.01
        )

    def _cached_chars(self, prompt: str) -> int:
        """Characters of `prompt`'s longest prefix that the simulated cache holds."""
        return max((len(os.path.commonprefix([prompt, t])) for t in self.cached_texts), default=0)

    def flush_cache(self) -> bool:
        """Empties the simulated cache (True); False without one, as a backend that cannot."""
        self.flushes += 1
        self.cached_texts.clear()
        return self.cache

    def tokenize(self, text: str) -> list[int]:
        raise BackendError("reply backend: no tokenizer")
