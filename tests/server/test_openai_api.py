"""The official `openai` client against the real server: chat and completions, streaming and not."""

from __future__ import annotations

import openai
import pytest

from runtime.backends import connect
from tests.support.server_util import LONG_SYSTEM


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def _messages(question: str) -> list[dict]:
    return [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": question}]


def test_chat_non_stream(client, engine) -> None:
    r = client.chat.completions.create(model="m", messages=_messages("chat A?"), max_tokens=2, temperature=0)
    r2 = client.chat.completions.create(model="m", messages=_messages("chat B?"), max_tokens=2, temperature=0)
    assert r.choices[0].message.role == "assistant" and isinstance(r.choices[0].message.content, str)
    assert r.usage.prompt_tokens_details is not None
    assert r2.usage.prompt_tokens_details.cached_tokens > 100
    # same greedy request through the embedded backend: same text
    prompt = engine.apply_chat_template(_messages("chat B?"))
    embedded = connect(engine).generate(prompt, sampling_params={"max_new_tokens": 2, "temperature": 0})
    assert embedded.text == r2.choices[0].message.content


def test_chat_stream_with_usage(client) -> None:
    client.chat.completions.create(model="m", messages=_messages("stream A?"), max_tokens=1, temperature=0)
    stream = client.chat.completions.create(
        model="m",
        messages=_messages("stream B?"),
        max_tokens=3,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert (
        usage is not None and usage.completion_tokens >= 1 and usage.prompt_tokens_details.cached_tokens > 100
    )
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)
    full = client.chat.completions.create(
        model="m", messages=_messages("stream B?"), max_tokens=3, temperature=0
    )
    assert text == full.choices[0].message.content


def test_completions_non_stream_and_stream(client, engine) -> None:
    r1 = client.completions.create(model="m", prompt=LONG_SYSTEM + "\nQ: one", max_tokens=3, temperature=0)
    r2 = client.completions.create(model="m", prompt=LONG_SYSTEM + "\nQ: two", max_tokens=3, temperature=0)
    assert r1.usage.prompt_tokens_details is not None  # always present, even on a miss
    assert r2.usage.prompt_tokens_details.cached_tokens > 100
    stream = client.completions.create(
        model="m",
        prompt=LONG_SYSTEM + "\nQ: two",
        max_tokens=3,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r2.choices[0].text
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 100
    embedded = connect(engine).generate(
        LONG_SYSTEM + "\nQ: two", sampling_params={"max_new_tokens": 3, "temperature": 0}
    )
    assert embedded.text == r2.choices[0].text


def test_completions_stop_seed_and_json_schema(client) -> None:
    r = client.completions.create(model="m", prompt="1, 2, 3,", max_tokens=8, temperature=0, stop=[","])
    assert "," not in r.choices[0].text
    a = client.completions.create(model="m", prompt="Once", max_tokens=4, temperature=1.0, seed=7)
    b = client.completions.create(model="m", prompt="Once", max_tokens=4, temperature=1.0, seed=7)
    assert a.choices[0].text == b.choices[0].text
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    r = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Give JSON"}],
        max_tokens=12,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    )
    assert r.choices[0].message.content.lstrip().startswith("{")


def test_models_list(client, engine) -> None:
    assert [m.id for m in client.models.list()] == [engine.model_info["served_model_name"]]
