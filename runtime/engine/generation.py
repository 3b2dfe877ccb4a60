"""The one request type, top-down: built once (by `Backend.generate`, `Engine.generate` or the
HTTP routes) and carried unchanged to the engine, which turns it into its scheduling state.

Torch-free on purpose: HTTP clients build and send it too. The shape of each field is checked
here; what needs the model (tokenizing, vocabulary, context window, sampling values) is checked
once by the engine (`Engine._request`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.cache.namespace import Salt
from runtime.errors import InvalidRequest

#: SGLang's per-request logprob arguments of `generate` (each one value or one per prompt)
LOGPROB_ARGS = ("return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs")


@dataclass(frozen=True, slots=True)
class LogprobArgs:
    """SGLang's logprob arguments for one prompt (see runtime/engine/logprobs.py)."""

    return_logprob: bool = False
    logprob_start_len: int | None = None  # checked by LogprobSpec.resolve
    top_logprobs_num: int | None = None
    return_text_in_logprobs: bool = False

    def as_kwargs(self) -> dict[str, object]:
        """Only what was set (the wire form of the HTTP backends)."""
        if not self.return_logprob:
            return {}
        out: dict[str, object] = {"return_logprob": True}
        for key in ("logprob_start_len", "top_logprobs_num"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.return_text_in_logprobs:
            out["return_text_in_logprobs"] = True
        return out


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One prompt (text or token ids) with everything that shapes its generation."""

    prompt: str | None = None
    input_ids: tuple[int, ...] | None = None
    sampling_params: Mapping[str, object] = field(default_factory=dict)  # SGLang's JSON shape
    cache_salt: Salt = None
    prefix_cache: bool = True  # False: this request neither reads nor writes the prefix cache
    session_id: str | None = None
    priority: int | None = None
    rid: str | None = None
    logprobs: LogprobArgs = LogprobArgs()

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.input_ids is None):
            raise InvalidRequest("give exactly one of prompt / text and input_ids")
        if self.prompt is not None and not isinstance(self.prompt, str):
            raise InvalidRequest("prompt must be a string")
        if self.input_ids is not None:
            if not isinstance(self.input_ids, tuple):
                object.__setattr__(self, "input_ids", tuple(self.input_ids))
            if not all(isinstance(t, int) and not isinstance(t, bool) for t in self.input_ids):
                raise InvalidRequest("input_ids must be integers")
        if not isinstance(self.sampling_params, Mapping):
            raise InvalidRequest("sampling_params must be an object")
        if self.priority is not None and (
            isinstance(self.priority, bool) or not isinstance(self.priority, int)
        ):
            raise InvalidRequest("priority must be an integer")
        if self.session_id is not None and not isinstance(self.session_id, str):
            raise InvalidRequest("session_id must be a string")
        if self.rid is not None and not isinstance(self.rid, str):
            raise InvalidRequest("rid must be a string")

    @classmethod
    def of(
        cls,
        prompt: str | None = None,
        input_ids: Sequence[int] | None = None,
        sampling_params: Mapping[str, object] | None = None,
        **fields: Any,
    ) -> GenerationRequest:
        """From `generate`'s keyword arguments for one prompt (logprob ones included)."""
        lp = {k: fields.pop(k) for k in LOGPROB_ARGS if k in fields}
        return cls(
            prompt=prompt,
            input_ids=tuple(input_ids) if input_ids is not None else None,
            sampling_params=dict(sampling_params or {}),
            logprobs=LogprobArgs(**lp) if lp.get("return_logprob") else LogprobArgs(),
            **fields,
        )

    @classmethod
    def batch(
        cls,
        prompt: str | list[str] | None = None,
        input_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
        sampling_params: Mapping[str, object] | list[Mapping[str, object]] | None = None,
        cache_salt: Salt | list[Salt] = None,
        rid: str | list[str] | None = None,
        **shared: Any,
    ) -> list[GenerationRequest]:
        """SGLang's `generate` arguments: one prompt, or a list of prompts with per-prompt
        `sampling_params` / `cache_salt` / `rid` / logprob arguments given once or as lists."""
        if (prompt is None) == (input_ids is None):
            raise InvalidRequest("give exactly one of prompt / text and input_ids")
        prompts: list[Any] = (
            (list(prompt) if isinstance(prompt, list) else [prompt])
            if prompt is not None
            else (list(input_ids) if is_batch(None, input_ids) else [input_ids])  # type: ignore[arg-type]
        )
        n = len(prompts)
        unknown = set(shared) - set(LOGPROB_ARGS) - {"prefix_cache", "session_id", "priority"}
        if unknown:
            raise InvalidRequest(f"unknown arguments: {sorted(unknown)}")
        per_item = {
            "sampling_params": _per_item(sampling_params, n, "sampling_params"),
            "cache_salt": _per_item(cache_salt, n, "cache_salt"),
            "rid": _per_item(rid, n, "rid"),
        } | {k: _per_item(shared.pop(k), n, k) for k in LOGPROB_ARGS if k in shared}
        key = "prompt" if prompt is not None else "input_ids"
        return [
            cls.of(**{key: p}, **{k: v[i] for k, v in per_item.items()}, **shared)
            for i, p in enumerate(prompts)
        ]


def is_batch(prompt: object, input_ids: object) -> bool:
    """A list of prompts (or of id lists) is a batch: results come back as a list."""
    return isinstance(prompt, list) or (
        isinstance(input_ids, (list, tuple)) and bool(input_ids) and isinstance(input_ids[0], (list, tuple))
    )


def _per_item(value: Any, n: int, name: str) -> list[Any]:
    if isinstance(value, list) and not (
        name == "sampling_params" and value and not isinstance(value[0], dict)
    ):
        if len(value) != n:
            raise InvalidRequest(f"{name} has {len(value)} entries for {n} prompts")
        return value
    return [value] * n
