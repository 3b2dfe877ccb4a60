"""Request bodies of the HTTP API (pydantic, strict types: "5" is not an int, true is not a number).

Every field a model declares is honoured; an unknown field, top level or inside `sampling_params`,
is a 400 naming it (docs/compat.md lists every OpenAI and SGLang field and what happens to it).
Values are checked here; the engine re-checks ranges (`SamplingParams`).
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from runtime.engine.grammar_guard import check_schema_value
from runtime.server import limits

#: strict types; NaN and ±Infinity (which Python's JSON parser reads) are not numbers here
_STRICT = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


#: the seed range torch's generators take
SEED = Field(default=None, ge=-(2**63), le=2**64 - 1)
#: session ids are keys of a global registry: non-empty and bounded
#: session_id: 1..256 characters (a type, so that mypy sees the constraint pydantic enforces)
SessionId = Annotated[str, StringConstraints(min_length=1, max_length=256)]
#: cache_salt / extra_key: the tree stores a digest, the bound keeps request memory small too
SALT = Field(default=None, max_length=limits.MAX_SALT_CHARS)


def has_lone_surrogate(value: object) -> bool:
    """True when a string anywhere in `value` (keys too) holds a lone UTF-16 surrogate: valid JSON
    (`"\\ud800"`) but not Unicode, so no tokenizer or UTF-8 response could carry it. Iterative, so
    deep nesting cannot overflow the stack."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


class _Request(BaseModel):
    """Base of every request body: strict types, unknown fields ignored, Unicode checked once."""

    model_config = _STRICT

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: object) -> object:
        if has_lone_surrogate(data):
            raise ValueError("invalid Unicode: a string holds a lone surrogate (\\ud800-\\udfff)")
        limits.check_nesting(data)  # before templates and validators recurse into it
        return data


class SamplingParamsIn(BaseModel):
    """SGLang's `sampling_params` object (its schema rejects unknown keys, so does this one).

    None means "not set". `seed` is our name; SGLang's `sampling_seed` is accepted as its alias.
    Penalties, `min_new_tokens`, `logit_bias` and `ebnf` are applied as SGLang applies them, and so
    are `spaces_between_special_tokens`, `no_stop_trim` and `stream_interval` (runtime/engine/sampling.py).
    """

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)

    max_new_tokens: int | None = Field(default=None, ge=0)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = None
    min_p: float | None = Field(default=None, ge=0, le=1)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    json_schema: str | None = None
    regex: str | None = None
    seed: int | None = SEED
    sampling_seed: int | None = SEED
    skip_special_tokens: bool | None = None
    n: int | None = Field(default=None, ge=1, le=1)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    repetition_penalty: float | None = Field(default=None, gt=0, le=2)
    min_new_tokens: int | None = Field(default=None, ge=0)
    ebnf: str | None = None
    logit_bias: dict[str, float] | None = None
    spaces_between_special_tokens: bool | None = None
    no_stop_trim: bool | None = None
    stream_interval: int | None = Field(default=None, ge=1)
    # SGLang features this server refuses rather than ignores (they change the output)
    stop_regex: str | list[str] | None = None
    structural_tag: str | None = None

    @model_validator(mode="after")
    def _supported(self) -> SamplingParamsIn:
        for name in ("stop_regex", "structural_tag"):
            if getattr(self, name):
                raise ValueError(f"{name} is not supported by this server")
        return self

    def to_dict(self) -> dict[str, object]:
        """The set values only, in the shape `SamplingParams.from_dict` takes."""
        params = self.model_dump(exclude_none=True, exclude={"sampling_seed", "n"})
        if self.seed is None and self.sampling_seed is not None:
            params["seed"] = self.sampling_seed
        for name in ("stop_regex", "structural_tag"):
            params.pop(name, None)
        return params


#: fields SGLang's routers (smg, sglang-router) put on every /generate they forward, at SGLang's
#: defaults: at exactly these values they ask for what this server does anyway, so they are taken
#: (and dropped); any other value stays an unknown field, i.e. a 400 naming it (docs/compat.md).
ROUTER_DEFAULTS: dict[str, object] = {
    "log_metrics": True,
    "background": False,
    "no_logs": False,
    "return_bytes": False,
    "return_entropy": False,
    "return_hidden_states": False,
}


class GenerateRequest(_Request):
    """POST /generate (SGLang native)."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    #: one for every prompt, or a list with one per prompt of a batch
    sampling_params: SamplingParamsIn | list[SamplingParamsIn] | None = None
    stream: bool = False
    rid: str | list[str] | None = None
    session_params: dict[str, object] | None = None
    session_id: SessionId | None = None
    cache_salt: str | None = SALT
    extra_key: str | None = SALT
    priority: int | None = None
    prefix_cache: bool = True
    return_logprob: bool | list[bool] = False
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    return_text_in_logprobs: bool = False

    @model_validator(mode="before")
    @classmethod
    def _router_defaults(cls, data: object) -> object:
        if not isinstance(data, dict):
            return data
        taken = [k for k, v in ROUTER_DEFAULTS.items() if k in data and data[k] is v]
        if "model" in data and (data["model"] is None or isinstance(data["model"], str)):
            # smg names the served model, sglang-router sends null: one model is served here
            taken.append("model")
        return {k: v for k, v in data.items() if k not in taken} if taken else data

    def sampling_dicts(self) -> dict[str, object] | list[dict[str, object]]:
        if isinstance(self.sampling_params, list):
            if not self.is_batch:
                raise ValueError("sampling_params: a list needs a batch of prompts (one entry per prompt)")
            return [p.to_dict() for p in self.sampling_params]
        return self.sampling_params.to_dict() if self.sampling_params else {}

    def logprob_kwargs(self) -> dict[str, object]:
        """SGLang's logprob arguments of `engine.generate` (only when some prompt asks for logprobs)."""
        if not self.wants_logprobs:
            return {}
        return {
            "return_logprob": self.return_logprob,
            "logprob_start_len": self.logprob_start_len,
            "top_logprobs_num": self.top_logprobs_num,
            "return_text_in_logprobs": self.return_text_in_logprobs,
        }

    @model_validator(mode="after")
    def _one_input(self) -> GenerateRequest:
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("exactly one of 'text' or 'input_ids' must be given")
        return self

    @property
    def is_batch(self) -> bool:
        if self.text is not None:
            return isinstance(self.text, list)
        ids = self.input_ids
        return ids is not None and len(ids) > 0 and isinstance(ids[0], list)

    @property
    def wants_logprobs(self) -> bool:
        flags = self.return_logprob if isinstance(self.return_logprob, list) else [self.return_logprob]
        return any(flags)


class StreamOptions(BaseModel):
    model_config = _STRICT

    include_usage: bool = False
    continuous_usage_stats: bool = False


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True, allow_inf_nan=False)

    name: str | None = None
    schema_: dict[str, object] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = _STRICT

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema":
            if self.json_schema is None or self.json_schema.schema_ is None:
                raise ValueError("json_schema.schema is required when type is 'json_schema'")
            check_schema_value(self.json_schema.schema_, "response_format.json_schema.schema")
        return self

    def to_json_schema(self) -> str | None:
        """The sampling `json_schema` string this format asks for (None: unconstrained)."""
        if self.type == "json_object":
            return json.dumps({"type": "object"})
        if self.type == "json_schema":
            if self.json_schema is None or self.json_schema.schema_ is None:
                raise ValueError("response_format.json_schema.schema is required")
            return json.dumps(self.json_schema.schema_)
        return None


class _OpenAIBase(_Request):
    """Fields shared by /v1/completions and /v1/chat/completions (OpenAI + SGLang extensions)."""

    model: str | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = SEED
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    logprobs: bool | int | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    # SGLang extensions (sent by clients through `extra_body`)
    top_k: int | None = None
    min_p: float | None = Field(default=None, ge=0, le=1)
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    regex: str | None = None
    json_schema: str | None = None
    ebnf: str | None = None
    repetition_penalty: float | None = Field(default=None, gt=0, le=2)
    min_tokens: int | None = Field(default=None, ge=0)
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    no_stop_trim: bool | None = None
    rid: str | None = None
    session_id: SessionId | None = None
    session_params: dict[str, object] | None = None
    #: OpenAI's cache key: names the request's session for `--trace-dir` (not an engine session)
    prompt_cache_key: SessionId | None = None
    cache_salt: str | None = SALT
    priority: int | None = None
    prefix_cache: bool = True

    def sampling_dict(self, max_new_tokens: int | None) -> dict[str, object]:
        """SGLang `sampling_params` for this request."""
        params: dict[str, object] = {
            "max_new_tokens": max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "stop": self.stop,
            "stop_token_ids": self.stop_token_ids,
            "ignore_eos": self.ignore_eos,
            "regex": self.regex,
            "json_schema": self.json_schema,
            "ebnf": self.ebnf,
            "seed": self.seed,
            "skip_special_tokens": self.skip_special_tokens,
            "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty,
            "repetition_penalty": self.repetition_penalty,
            "min_new_tokens": self.min_tokens,
            "logit_bias": self.logit_bias,
            "spaces_between_special_tokens": self.spaces_between_special_tokens,
            "no_stop_trim": self.no_stop_trim,
        }
        if self.response_format is not None:
            schema = self.response_format.to_json_schema()
            if schema is not None:
                params["json_schema"] = schema
        return {k: v for k, v in params.items() if v is not None}

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.continuous_usage_stats


class CompletionRequest(_OpenAIBase):
    """POST /v1/completions."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=0)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1, le=16)
    logprobs: int | None = Field(default=None, ge=0, le=20)


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, object]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, object]] | None = None
    tool_call_id: str | None = None


class ChatCompletionRequest(_OpenAIBase):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    # OpenAI refuses 0 on chat (completions keep SGLang's 0: prompt logprobs with echo)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[dict[str, object]] | None = None
    tool_choice: str | dict[str, object] | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, object] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    #: SGLang's: with --reasoning-parser, the thinking block comes back as `reasoning_content`;
    #: false keeps the raw text in `content`
    separate_reasoning: bool = True
    #: OpenAI's; see ReasoningChat.effort (runtime/server/reasoning_chat.py)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    #: OpenAI's, harmless here (docs/compat.md): chat completions are never stored, `metadata` is
    #: only checked (at most 16 string pairs), the one service tier is "default"
    store: bool | None = None
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = Field(default=None, max_length=16)
    service_tier: Literal["auto", "default", "flex", "priority", "scale"] | None = None

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class OpenSessionRequest(_Request):
    capacity_of_str_len: int | None = Field(default=None, ge=0)
    session_id: SessionId | None = None
    cache_salt: str | None = SALT  # the session belongs to this salt


class CloseSessionRequest(_Request):
    session_id: SessionId
    cache_salt: str | None = SALT


class SessionEventRequest(_Request):
    """POST /session_event: `{session_id, event, ...info}`. The info fields the session registry reads
    are typed (a wrong type is a 400); other keys are ignored, never passed on to the engine."""

    session_id: SessionId
    event: Literal["open", "tool_wait", "resume", "abandon", "close"]
    expected_s: float | None = Field(default=None, ge=0)
    tool: str | None = None
    input_ids: list[int] | None = None
    keep: int | None = Field(default=None, ge=0)
    cache_salt: str | None = SALT

    @property
    def info(self) -> dict[str, object]:
        return self.model_dump(exclude_none=True, exclude={"session_id", "event"})


class TokenizeRequest(_Request):
    model: str | None = None
    prompt: str | list[str]
    add_special_tokens: bool = True


class DetokenizeRequest(_Request):
    model: str | None = None
    tokens: list[int] | list[list[int]]
    skip_special_tokens: bool = True


class AbortRequestBody(_Request):
    """POST /abort_request (SGLang's AbortReq): `rid` matches as a prefix; `abort_all` stops all."""

    rid: str = ""
    abort_all: bool = False
    #: our extension: only requests in this salt's cache namespace (a tenant's own; required
    #: without the admin role on a server with keys)
    cache_salt: str | None = Field(default=None, max_length=limits.MAX_SALT_CHARS)


class UpdateWeightsFromDiskBody(_Request):
    """POST /update_weights_from_disk (SGLang's UpdateWeightFromDiskReqInput, the fields we serve)."""

    model_path: str = Field(min_length=1)
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    flush_cache: bool = True
    is_async: bool = False
    keep_pause: bool = False

    @model_validator(mode="after")
    def _served(self) -> UpdateWeightsFromDiskBody:
        if not self.flush_cache:
            raise ValueError("flush_cache: must be true: new weights always invalidate the whole cache")
        if self.is_async:
            raise ValueError("is_async: not supported: the update waits for running requests to finish")
        if self.keep_pause:
            raise ValueError("keep_pause: not supported (no pause_generation / continue_generation here)")
        return self
