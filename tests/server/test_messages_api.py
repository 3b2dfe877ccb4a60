"""Anthropic Messages API through the real `anthropic` client against the real server and model:
plain create, tools (any / named / a 3-turn loop where the tool runs), streams, count_tokens against
billed usage, cache diagnostics, structured output, error shapes and x-api-key auth."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest

from evals.benchmarks.doors.anthropic_agent import TOOLS  # noqa: E402
from tests.support.server_util import API_KEY

pytestmark = pytest.mark.slow

MODEL = "smollm2"
ADD = TOOLS[0]  # the benchmark's agent tool: one definition of `add`
SYSTEM = "You are a helpful assistant with tools. Answer briefly."


@pytest.fixture(scope="module")
def client(server: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=300)


def _ask(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def test_plain_create_has_message_shape_and_usage(client: anthropic.Anthropic) -> None:
    m = client.messages.create(
        model=MODEL, max_tokens=8, system=SYSTEM, messages=_ask("Say hi."), extra_body={"temperature": 0}
    )
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert m.content and m.content[0].type == "text"
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert m.usage.output_tokens >= 1 and m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) > 10


def test_stop_sequence_is_reported(client: anthropic.Anthropic) -> None:
    m = client.messages.create(
        model=MODEL,
        max_tokens=40,
        messages=_ask("Count: 1, 2, 3, 4, 5, 6"),
        stop_sequences=[","],
        extra_body={"top_k": 1},
    )
    if m.stop_reason == "stop_sequence":
        assert m.stop_sequence == ","
    else:  # the model may end first; never a wrong reason
        assert m.stop_reason in ("end_turn", "max_tokens")


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "add"}])
def test_forced_tool_use_has_schema_valid_input(client: anthropic.Anthropic, choice: dict[str, Any]) -> None:
    m = client.messages.create(
        model=MODEL,
        max_tokens=60,
        system=SYSTEM,
        messages=_ask("What is 2 plus 3?"),
        tools=[ADD],
        tool_choice=choice,  # type: ignore[arg-type]
        extra_body={"temperature": 0},  # greedy: a sampled integer may run past max_tokens
    )
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and uses and uses[0].name == "add"
    assert isinstance(uses[0].input, dict) and set(uses[0].input) == {"a", "b"}  # type: ignore[arg-type]


def run_tool_loop(client: anthropic.Anthropic, turns: int) -> list[anthropic.types.Message]:
    """A tool agent: each forced `add` call really runs; its result goes back as a tool_result."""
    messages: list[dict[str, Any]] = _ask("Add 2 and 3, then add the result to 4.")
    out = []
    for _ in range(turns):
        m = client.messages.create(
            model=MODEL,
            max_tokens=60,
            system=SYSTEM,
            messages=messages,
            tools=[ADD],  # type: ignore[arg-type]
            tool_choice={"type": "any"},
            extra_body={"temperature": 0},
        )
        out.append(m)
        use = next(b for b in m.content if b.type == "tool_use")
        result = int(use.input["a"]) + int(use.input["b"])  # type: ignore[index]
        messages.append({"role": "assistant", "content": [b.model_dump() for b in m.content]})
        block = {"type": "tool_result", "tool_use_id": use.id, "content": str(result)}
        messages.append({"role": "user", "content": [block]})
    return out


def test_three_turn_tool_loop_reuses_the_cache(client: anthropic.Anthropic) -> None:
    ms = run_tool_loop(client, 3)
    for m in ms[1:]:
        u = m.usage
        total = u.input_tokens + (u.cache_read_input_tokens or 0)
        assert (u.cache_read_input_tokens or 0) >= 0.9 * total * 0.9  # the earlier turns' prefix
    later = ms[2].usage
    assert (later.cache_read_input_tokens or 0) > ms[0].usage.input_tokens


def test_turn_two_reads_90_percent_of_the_prompt_from_cache(client: anthropic.Anthropic) -> None:
    long_system = SYSTEM + " " + " ".join(f"Rule {i}: be precise." for i in range(40))
    first = client.messages.create(model=MODEL, max_tokens=6, system=long_system, messages=_ask("Hi."))
    msgs = _ask("Hi.") + [{"role": "assistant", "content": first.content[0].text}] + _ask("Thanks.")  # type: ignore[union-attr]
    second = client.messages.create(model=MODEL, max_tokens=6, system=long_system, messages=msgs)  # type: ignore[arg-type]
    u = second.usage
    assert (u.cache_read_input_tokens or 0) >= 0.9 * (u.input_tokens + (u.cache_read_input_tokens or 0))


def test_count_tokens_equals_billed_input(client: anthropic.Anthropic) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "system": SYSTEM,
        "messages": _ask("What is 7 plus 8?"),
        "tools": [ADD],
    }
    counted = client.messages.count_tokens(**kwargs).input_tokens
    u = client.messages.create(max_tokens=4, **kwargs).usage
    assert counted == u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0)


def test_stream_helper_and_raw_events(client: anthropic.Anthropic) -> None:
    with client.messages.stream(model=MODEL, max_tokens=8, messages=_ask("Say hi.")) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == final.content[0].text  # type: ignore[union-attr]
    events = list(
        client.messages.create(
            model=MODEL,
            max_tokens=40,
            messages=_ask("What is 1 plus 1?"),
            tools=[ADD],
            tool_choice={"type": "any"},
            stream=True,
        )
    )  # type: ignore[arg-type]
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "message_delta" in kinds
    assert events[0].message.usage.input_tokens > 0  # type: ignore[union-attr]
    partial = "".join(
        e.delta.partial_json
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    )  # type: ignore[union-attr]
    assert set(json.loads(partial)) == {"a", "b"}


def test_diagnostics_appended_turn_then_system_change(client: anthropic.Anthropic) -> None:
    first = client.messages.create(model=MODEL, max_tokens=6, system=SYSTEM, messages=_ask("Hello there."))
    msgs = _ask("Hello there.") + [{"role": "assistant", "content": first.content[0].text}] + _ask("More.")  # type: ignore[union-attr]
    diag = {"previous_message_id": first.id}
    same = client.messages.create(model=MODEL, max_tokens=6, system=SYSTEM, messages=msgs, diagnostics=diag)  # type: ignore[arg-type]
    assert same.diagnostics is not None and same.diagnostics.cache_miss_reason is None
    changed = client.messages.create(
        model=MODEL, max_tokens=6, system="You are terse and rude.", messages=msgs, diagnostics=diag
    )  # type: ignore[arg-type]
    reason = changed.diagnostics.cache_miss_reason  # type: ignore[union-attr]
    assert reason is not None and reason.type == "system_changed"
    assert reason.cache_missed_input_tokens > 0  # type: ignore[union-attr]
    gone = client.messages.create(
        model=MODEL, max_tokens=2, messages=_ask("x"), diagnostics={"previous_message_id": "msg_nope"}
    )
    assert gone.diagnostics.cache_miss_reason.type == "previous_message_not_found"  # type: ignore[union-attr]


def test_structured_output_follows_the_schema(client: anthropic.Anthropic) -> None:
    schema = {
        "type": "object",
        # bounded so that a sampled (default temperature 1) answer always closes within max_tokens
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999}},
        "required": ["n"],
        "additionalProperties": False,
    }
    m = client.messages.create(
        model=MODEL,
        max_tokens=64,
        messages=_ask("Give a number as JSON."),
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )
    assert isinstance(json.loads(m.content[0].text)["n"], int)  # type: ignore[union-attr]


def test_errors_have_anthropic_shape(server: Any, client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(
            model=MODEL, max_tokens=4, messages=_ask("x"), thinking={"type": "enabled", "budget_tokens": 1024}
        )
    assert err.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    r = httpx.post(f"{server.url}/v1/messages", json={"model": MODEL, "messages": _ask("x")})
    body = r.json()
    assert r.status_code == 400 and body["type"] == "error" and "max_tokens" in body["error"]["message"]
    r = httpx.post(
        f"{server.url}/v1/messages", json={"model": MODEL, "max_tokens": 2, "messages": _ask("x"), "bogus": 1}
    )
    assert r.status_code == 400 and "bogus" in r.json()["error"]["message"]


def test_x_api_key_auth(secured_server: Any) -> None:
    bad = anthropic.Anthropic(base_url=secured_server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as err:
        bad.messages.create(model=MODEL, max_tokens=2, messages=_ask("x"))
    assert err.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    good = anthropic.Anthropic(base_url=secured_server.url, api_key=API_KEY, max_retries=0, timeout=300)
    assert good.messages.create(model=MODEL, max_tokens=2, messages=_ask("x")).usage.output_tokens >= 1
    bearer = httpx.post(
        f"{secured_server.url}/v1/messages/count_tokens",
        headers={"Authorization": f"Bearer {API_KEY}"},
        json={"model": MODEL, "messages": _ask("x")},
    )
    assert bearer.status_code == 200 and bearer.json()["input_tokens"] > 0


def test_six_call_anthropic_agent_door_reads_earlier_turns_from_cache(server: Any) -> None:
    from evals.benchmarks.doors.anthropic_agent import run_anthropic_agent

    rows = run_anthropic_agent(server.url, turns=6, max_tokens=40)
    assert len(rows) == 6
    for prev, row in zip(rows, rows[1:], strict=False):
        assert row["cached_tokens"] >= 0.9 * prev["prompt_tokens"]


def test_stream_is_live_and_matches_the_plain_answer(client: anthropic.Anthropic) -> None:
    """Streamed as the tokens come: message_start carries the prompt's tokens, the final message
    equals the non-streamed one (greedy), and a stop sequence is reported in the stream too."""
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 24,
        "messages": _ask("Count: 1, 2, 3, 4, 5, 6"),
        "extra_body": {"top_k": 1},
    }
    plain = client.messages.create(**kwargs)
    events = list(client.messages.create(stream=True, **kwargs))
    start = events[0].message.usage  # type: ignore[union-attr]
    assert start.input_tokens + (start.cache_read_input_tokens or 0) == plain.usage.input_tokens + (
        plain.usage.cache_read_input_tokens or 0
    )
    text = "".join(
        e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"
    )  # type: ignore[union-attr]
    assert text == plain.content[0].text  # type: ignore[union-attr]
    stop = client.messages.create(stream=True, stop_sequences=[","], **kwargs)
    deltas = [e for e in stop if e.type == "message_delta"]
    assert deltas and deltas[0].delta.stop_reason in ("stop_sequence", "end_turn", "max_tokens")
    if deltas[0].delta.stop_reason == "stop_sequence":
        assert deltas[0].delta.stop_sequence == ","
