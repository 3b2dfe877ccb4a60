"""Request body of `POST /v1/responses` (pydantic, strict, unknown fields are a 400 naming them).

Only the request shape is here (the routes: api.py). Tool types other than `function` are refused by
name; items and parts are checked key by key in translate.py.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from runtime.server import limits

_STRICT = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)
#: items and tools keep their own keys; the translation layer checks them item by item
_OPEN = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)


class ResponsesTool(BaseModel):
    """One entry of `tools`: only function tools can be honoured (grammar-forced arguments)."""

    model_config = _OPEN
    type: str

    @model_validator(mode="after")
    def _function_only(self) -> ResponsesTool:
        if self.type != "function":
            raise ValueError(f"tools: type {self.type!r} is not supported here (only 'function')")
        return self


class PromptCacheOptions(BaseModel):
    """OpenAI's `prompt_cache_options`: the cache here is automatic; `ttl` is a retention hint."""

    model_config = _STRICT
    mode: str | None = None
    ttl: str | None = None


class ReasoningOptions(BaseModel):
    """`reasoning`: `effort` is chat's `reasoning_effort` (ReasoningChat.effort); summaries are not
    written here, so a `summary` other than null is a 400."""

    model_config = _STRICT
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: None = None
    generate_summary: None = None


class ResponsesRequest(BaseModel):
    """The fields issue 35 lists; anything else is a 400 naming it (extra="forbid")."""

    model_config = _STRICT
    model: str | None = None
    input: str | list[dict[str, object]]
    instructions: str | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: str | dict[str, object] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool = False
    metadata: dict[str, str] | None = None
    user: str | None = None
    store: bool = True
    previous_response_id: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    include: list[str] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    cache_salt: str | None = Field(default=None, max_length=limits.MAX_SALT_CHARS)
    regex: str | None = None
    ebnf: str | None = None
    session_id: str | None = Field(default=None, min_length=1, max_length=256)
    prefix_cache: bool = True
    reasoning: ReasoningOptions | None = None
    service_tier: Literal["auto", "default", "flex", "priority", "scale"] | None = None

    @model_validator(mode="after")
    def _one_constraint(self) -> ResponsesRequest:
        forced = [n for n in ("regex", "ebnf") if getattr(self, n) is not None]
        if self.text and self.text.get("format", {}).get("type") in ("json_schema", "json_object"):
            forced.append("text.format")
        if len(forced) > 1:
            raise ValueError(f"only one output constraint at a time, got {', '.join(forced)}")
        return self
