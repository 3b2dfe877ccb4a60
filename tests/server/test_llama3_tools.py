"""Tool calls on a tiny Llama 3 (tests/families.py, Llama 3.2's chat template) with
`--tool-call-parser llama3`: the call block starts at the special `<|python_tag|>` token (a
grammar that spelled it as text was refused at the first token), and a tool-call turn sent back
is rendered as generated, though Llama 3's template writes calls as spaced, untagged JSON."""

from __future__ import annotations

import json

import httpx
import pytest

from runtime import Engine
from runtime.server import ServerArgs, create_app
from tests.families import build_family
from tests.support.server_util import LiveServer

pytestmark = pytest.mark.slow  # the bundled tokenizer

TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {"type": "object", "properties": {"q": {"enum": ["alpha", "beta"]}}, "required": ["q"]},
    },
}
FIRST = [
    {"role": "system", "content": "You look things up. " * 10},
    {"role": "user", "content": "Look up alpha."},
]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    folder = build_family(tmp_path_factory.mktemp("llama3"), "llama3")
    eng = Engine(model_path=str(folder), max_total_tokens=8192)
    try:
        with LiveServer(create_app(eng, ServerArgs(tool_call_parser="llama3"))) as server:
            yield server
    finally:
        eng.shutdown()


def _chat(url: str, messages: list, **extra) -> dict:
    body = {"model": "m", "messages": messages, "temperature": 0, "max_tokens": 40, "tools": [TOOL], **extra}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_required_call_then_the_turn_sent_back_is_reused(live):
    first = _chat(
        live.url, FIRST, tool_choice="required", parallel_tool_calls=False
    )  # one per turn in Llama 3
    choice = first["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["function"]["name"] == "lookup" and json.loads(call["function"]["arguments"])["q"] in (
        "alpha",
        "beta",
    )
    back = {"role": "assistant", "content": None, "tool_calls": [call]}
    result = {"role": "tool", "tool_call_id": call["id"], "content": "alpha is the first letter"}
    second = _chat(live.url, [*FIRST, back, result], max_tokens=1)
    need = first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"] - 2
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= need


def test_auto_may_answer_in_text_or_call(live):
    out = _chat(live.url, FIRST, tool_choice="auto", max_tokens=8)
    choice = out["choices"][0]
    assert choice["finish_reason"] in ("tool_calls", "length", "stop")
    if choice["finish_reason"] == "tool_calls":
        assert choice["message"]["tool_calls"][0]["function"]["name"] == "lookup"
