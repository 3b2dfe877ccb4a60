"""Responses input -> chat body: the same messages/tools chat serves, refusals by name."""

from __future__ import annotations

import pytest

from runtime.server.responses.models import ResponsesRequest
from runtime.server.responses.translate import to_chat_body
from runtime.server.schemas import ChatCompletionRequest


def test_tool_loop_items_become_chat_messages() -> None:
    req = ResponsesRequest.model_validate(
        {
            "instructions": "be brief",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "add 1 2"}]},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a":1}'},
                {"type": "function_call_output", "call_id": "c1", "output": "3"},
            ],
            "tools": [{"type": "function", "name": "add", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "add"},
            "max_output_tokens": 20,
        }
    )
    body = to_chat_body(req)
    chat = ChatCompletionRequest.model_validate(body)
    assert [m.role for m in chat.messages] == ["system", "user", "assistant", "tool"]
    assert chat.messages[2].tool_calls == [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a":1}'}}
    ]
    assert body["tools"][0]["function"]["name"] == "add" and chat.max_tokens == 20
    assert body["tool_choice"] == {"type": "function", "function": {"name": "add"}}


def test_unsupported_item_and_part_are_named() -> None:
    bad_item = ResponsesRequest.model_validate({"input": [{"type": "file_search_call", "id": "x"}]})
    with pytest.raises(ValueError, match="file_search_call"):
        to_chat_body(bad_item)
    bad_part = ResponsesRequest.model_validate(
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}
    )
    with pytest.raises(ValueError, match="input_image"):
        to_chat_body(bad_part)
