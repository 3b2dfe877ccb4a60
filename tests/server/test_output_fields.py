"""SGLang's output-shaping sampling fields, honoured on both paths: `no_stop_trim`,
`skip_special_tokens`, `stream_interval`; and nothing unknown accepted and dropped."""

from __future__ import annotations

import json

import httpx
import pytest

from runtime.errors import InvalidRequest

pytestmark = pytest.mark.slow
COUNT = "1, 2, 3, 4, 5, 6,"


def test_no_stop_trim_keeps_the_stop_string(engine) -> None:
    base = {"max_new_tokens": 8, "temperature": 0, "stop": [","]}
    trimmed = engine.generate(prompt=COUNT, sampling_params=base)
    kept = engine.generate(prompt=COUNT, sampling_params={**base, "no_stop_trim": True})
    assert trimmed["meta_info"]["finish_reason"] == {"type": "stop", "matched": ","}
    assert kept["text"] == trimmed["text"] + ","


def test_special_tokens_in_the_text_on_request(engine) -> None:
    chat = engine.apply_chat_template([{"role": "user", "content": "Say hi."}])
    base = {"max_new_tokens": 40, "temperature": 0}
    plain = engine.generate(prompt=chat, sampling_params=base)
    assert plain["meta_info"]["finish_reason"]["type"] == "stop"  # ended on the end-of-turn token
    raw = engine.generate(
        prompt=chat, sampling_params={**base, "skip_special_tokens": False, "no_stop_trim": True}
    )
    end = engine.decode([plain["meta_info"]["finish_reason"]["matched"]])
    assert raw["text"] == plain["text"] + end and end.startswith("<|")


def test_stream_interval_over_http(server) -> None:
    params = {"max_new_tokens": 9, "temperature": 0, "ignore_eos": True, "stream_interval": 3}
    body = {"text": "Once upon a time", "stream": True, "sampling_params": params}
    with httpx.stream("POST", f"{server.url}/generate", json=body, timeout=120) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    assert [c["meta_info"]["completion_tokens"] for c in chunks] == [3, 6, 9]


def test_unknown_fields_are_refused_on_both_paths(server, engine) -> None:
    r = httpx.post(
        f"{server.url}/generate",
        json={"text": "hi", "sampling_params": {"max_new_tokens": 1, "temprature": 1}},
    )
    assert r.status_code == 400 and "temprature" in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/generate", json={"text": "hi", "strem": True})
    assert r.status_code == 400 and "strem" in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "hi", "max_tokens": 1, "tempreature": 0})
    assert r.status_code == 400 and "tempreature" in r.json()["error"]["message"]
    with pytest.raises(InvalidRequest, match="temprature"):
        engine.generate(prompt="hi", sampling_params={"temprature": 0})
    # SGLang's frontend always sends neutral penalties: accepted (they change nothing)
    neutral = {"max_new_tokens": 1, "frequency_penalty": 0.0, "presence_penalty": 0.0, "min_new_tokens": 0}
    assert (
        httpx.post(f"{server.url}/generate", json={"text": "hi", "sampling_params": neutral}).status_code
        == 200
    )
