"""Clients append the text past what they were sent and cannot take any back, so each streamed
text must be a prefix of the next and of the finished text. Two tails broke that: a character
whose UTF-8 bytes span tokens (CJK, emoji: byte-level BPE splits them) decodes as U+FFFD until its
last byte arrives (sent once, the placeholder stood in for the character for good), and the start
of a stop string that the finished text cuts off."""

from __future__ import annotations

import json

import httpx
import pytest

#: characters of 3 and 4 UTF-8 bytes; the bundled tokenizer spells each in 2-3 tokens
TEXT = "日本語です😀"
PARAMS = {"temperature": 0, "max_new_tokens": 32, "regex": TEXT}


def _split_characters(engine, ids: list[int]) -> bool:
    """Whether some prefix of `ids` ends inside a character (the case under test happened)."""
    return any(engine.tokenizer.decode(ids[:i]).endswith("\ufffd") for i in range(1, len(ids)))


@pytest.mark.parametrize(
    ("stop", "final"),
    [
        (None, TEXT),
        (["です"], "日本語"),
        (["語で"], "日本"),
        (["😀"], "日本語です"),
        (["本語", "す😀"], "日"),
    ],
)
def test_engine_streams_only_what_the_finished_text_keeps(engine, stop, final):
    params = PARAMS if stop is None else {**PARAMS, "stop": stop}
    chunks = list(engine.generate_stream(prompt="Say it:", sampling_params=params))
    assert chunks[-1]["text"] == final
    assert _split_characters(engine, chunks[-1]["output_ids"]), "no character spanned tokens: nothing tested"
    texts = [c["text"] for c in chunks]
    assert not any(t.endswith("\ufffd") for t in texts)
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False)), texts


def test_no_stop_trim_streams_up_to_the_stop(engine):
    params = {**PARAMS, "stop": ["です"], "no_stop_trim": True}
    texts = [c["text"] for c in engine.generate_stream(prompt="Say it:", sampling_params=params)]
    assert texts[-1] == "日本語です"
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False)), texts


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize(("stop", "final"), [(None, TEXT), (["語で"], "日本")])
def test_openai_stream_deltas_add_up_to_the_text(server, path, stop, final):
    body: dict = {
        "model": "m",
        "temperature": 0,
        "max_tokens": 32,
        "regex": TEXT,
        "stream": True,
        "stop": stop,
    }
    body |= (
        {"messages": [{"role": "user", "content": "Say it."}]} if "chat" in path else {"prompt": "Say it:"}
    )
    pieces = []
    with httpx.stream("POST", f"{server.url}{path}", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line.removeprefix("data: ")).get("choices", []):
                pieces.append(choice["delta"].get("content") or "" if "chat" in path else choice["text"])
    assert "\ufffd" not in "".join(pieces)
    assert "".join(pieces) == final


def test_responses_stream_deltas_add_up_to_the_text(server):
    body = {
        "model": "m",
        "input": "Say it.",
        "temperature": 0,
        "max_output_tokens": 32,
        "regex": TEXT,
        "stream": True,
    }
    deltas, done = [], None
    with httpx.stream("POST", f"{server.url}/v1/responses", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line.removeprefix("data: "))
            if event["type"] == "response.output_text.delta":
                deltas.append(event["delta"])
            elif event["type"] == "response.output_text.done":
                done = event["text"]
    assert "".join(deltas) == done == TEXT


def _messages(url: str, stream: bool, stop: list[str] | None = None) -> str:
    body: dict = {"model": "m", "max_tokens": 16, "temperature": 0, "stream": stream}
    body |= {"messages": [{"role": "user", "content": "Name three colours."}]}
    if stop:
        body["stop_sequences"] = stop
    if not stream:
        r = httpx.post(f"{url}/v1/messages", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return "".join(b["text"] for b in r.json()["content"] if b["type"] == "text")
    text = ""
    with httpx.stream("POST", f"{url}/v1/messages", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line.removeprefix("data: "))
                if event["type"] == "content_block_delta" and event["delta"]["type"] == "text_delta":
                    text += event["delta"]["text"]
    return text


def test_messages_stream_with_stop_sequences_sends_what_the_message_keeps(server):
    """The Anthropic door, on the model's own output: stop sequences cut from its middle (3
    characters: most span two tokens, the case where a stream sent their start early)."""
    whole = _messages(server.url, stream=False)
    assert len(whole) > 12
    for at in (len(whole) // 3, 2 * len(whole) // 3):
        stop = whole[at : at + 3]
        kept = _messages(server.url, stream=False, stop=[stop])
        assert kept == whole[: whole.find(stop)]
        assert _messages(server.url, stream=True, stop=[stop]) == kept
