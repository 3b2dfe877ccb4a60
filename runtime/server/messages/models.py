"""Pydantic models for the Messages API request (fields we do not know are a 400 naming them)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MessageParam(_Strict):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class ThinkingConfig(_Strict):
    type: Literal["disabled"]  # no Anthropic-style thinking budget: "enabled" is refused by name


class Metadata(_Strict):
    user_id: str | None = Field(default=None, max_length=4096)  # names the trace session


class Diagnostics(_Strict):
    previous_message_id: str | None = None


class CountTokensRequest(_Strict):
    model: str
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[dict[str, object]] | None = None
    tools: list[dict[str, object]] | None = None
    tool_choice: dict[str, object] | None = None
    thinking: ThinkingConfig | None = None
    output_config: dict[str, object] | None = None
    cache_control: dict[str, object] | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=1)
    metadata: Metadata | None = None
    stream: bool = False
    service_tier: Literal["auto", "standard_only"] | None = None
    diagnostics: Diagnostics | None = None
    # our extras, as on chat: the engine session to reuse, and the no-cache baseline switch
    session_id: str | None = Field(default=None, min_length=1, max_length=256)
    prefix_cache: bool = True
