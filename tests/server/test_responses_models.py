"""The Responses request model: honoured fields parse, refused ones name themselves."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from runtime.server.responses.models import ResponsesRequest


def test_plain_and_function_tools_parse() -> None:
    req = ResponsesRequest.model_validate(
        {"input": "hi", "tools": [{"type": "function", "name": "add", "parameters": {}}]}
    )
    assert req.store is True and req.tools is not None and req.tools[0].type == "function"


def test_non_function_tool_is_refused_by_name() -> None:
    with pytest.raises(ValidationError, match="web_search"):
        ResponsesRequest.model_validate({"input": "hi", "tools": [{"type": "web_search"}]})


def test_unknown_field_is_refused_by_name() -> None:
    with pytest.raises(ValidationError, match="background"):
        ResponsesRequest.model_validate({"input": "hi", "background": True})


def test_two_constraints_are_refused() -> None:
    with pytest.raises(ValidationError, match="regex, ebnf"):
        ResponsesRequest.model_validate({"input": "hi", "regex": "a", "ebnf": "root ::= 'a'"})
