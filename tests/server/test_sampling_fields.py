"""Logprobs, n > 1 and the sampling fields through the real server, with the official `openai`
client and SGLang's native /generate: every field is honoured, the same on both paths."""

from __future__ import annotations

import json
import math

import httpx
import openai
import pytest

from tests.support.server_util import LONG_SYSTEM, wait_idle

pytestmark = pytest.mark.slow

PROMPT = "The quick brown fox jumps over the lazy dog. " * 6 + "Then it"


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def http(server) -> httpx.Client:
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


def test_chat_logprobs_match_native(client, http, engine) -> None:
    messages = [{"role": "user", "content": "Name a color."}]
    r = client.chat.completions.create(
        model="m", messages=messages, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3
    )
    content = r.choices[0].logprobs.content
    assert "".join(c.token for c in content) == r.choices[0].message.content
    assert all(len(c.top_logprobs) == 3 and c.top_logprobs[0].token == c.token for c in content)
    assert all(bytes(c.bytes).decode() == c.token for c in content)
    native = http.post(
        "/generate",
        json={
            "text": engine.apply_chat_template(messages),
            "sampling_params": {"max_new_tokens": 5, "temperature": 0},
            "return_logprob": True,
            "top_logprobs_num": 3,
            "return_text_in_logprobs": True,
        },
    ).json()["meta_info"]
    assert [c.logprob for c in content] == [lp for lp, _, _ in native["output_token_logprobs"]][
        : len(content)
    ]
    plain = client.chat.completions.create(model="m", messages=messages, max_tokens=2, temperature=0)
    assert plain.choices[0].logprobs is None


def test_chat_logprobs_stream(client) -> None:
    messages = [{"role": "user", "content": "Count: one, two,"}]
    kw = {
        "model": "m",
        "messages": messages,
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    whole = client.chat.completions.create(**kw).choices[0]
    tokens, text = [], ""
    for chunk in client.chat.completions.create(stream=True, **kw):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.logprobs is not None:
                tokens += choice.logprobs.content
    assert text == whole.message.content
    assert [(t.token, t.logprob) for t in tokens] == [(t.token, t.logprob) for t in whole.logprobs.content]
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(model="m", messages=messages, max_tokens=1, top_logprobs=2)


def test_completion_echo_scores_a_string(client, engine) -> None:
    """lm-eval-harness' loglikelihood request: max_tokens 0, echo, logprobs."""
    context, continuation = "The capital of France is", " Paris"
    r = client.completions.create(
        model="m", prompt=context + continuation, max_tokens=0, echo=True, logprobs=1, temperature=0
    )
    choice = r.choices[0]
    assert choice.text == context + continuation
    lp = choice.logprobs
    ids = engine.tokenize(context + continuation)
    assert len(lp.tokens) == len(ids) and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert "".join(lp.tokens) == context + continuation and lp.text_offset[1] == len(lp.tokens[0])
    n_ctx = len(engine.tokenize(context))
    score = sum(lp.token_logprobs[n_ctx:])
    native = engine.generate(
        prompt=context + continuation,
        sampling_params={"max_new_tokens": 0},
        return_logprob=True,
        logprob_start_len=0,
    )
    assert score == sum(x[0] for x in native["meta_info"]["input_token_logprobs"][n_ctx:])
    worse = client.completions.create(
        model="m", prompt=context + " Banana", max_tokens=0, echo=True, logprobs=0
    )
    assert sum(worse.choices[0].logprobs.token_logprobs[n_ctx:]) < score < 0
    assert r.usage.completion_tokens == 0 and r.usage.prompt_tokens == len(ids)
    greedy = [max(t.items(), key=lambda kv: kv[1])[0] for t in lp.top_logprobs[1:]]
    assert len(greedy) == len(ids) - 1  # lm-eval's is_greedy check reads these


def test_completion_logprobs_stream_with_echo(client) -> None:
    kw = {
        "model": "m",
        "prompt": "Once upon a time",
        "max_tokens": 4,
        "temperature": 0,
        "logprobs": 2,
        "echo": True,
    }
    whole = client.completions.create(**kw).choices[0]
    text, tokens, offsets = "", [], []
    for chunk in client.completions.create(stream=True, **kw):
        for choice in chunk.choices:
            text += choice.text
            if choice.logprobs is not None:
                tokens += choice.logprobs.tokens
                offsets += choice.logprobs.text_offset
    assert text == whole.text and tokens == whole.logprobs.tokens and offsets == whole.logprobs.text_offset


def test_n2_distinct_with_seed_and_prompt_counted_once(client, engine) -> None:
    # a system prompt nothing else sent: the cache holds none of it before this test
    messages = [
        {"role": "system", "content": "Story club 7731. " + LONG_SYSTEM},
        {"role": "user", "content": "Tell me a story."},
    ]
    kw = {"model": "m", "messages": messages, "max_tokens": 12, "temperature": 1.0, "seed": 11}
    before = engine.get_cache_stats()["prefill_tokens_computed"]
    r = client.chat.completions.create(n=2, **kw)
    computed = engine.get_cache_stats()["prefill_tokens_computed"] - before
    a, b = (c.message.content for c in r.choices)
    assert a != b and [c.index for c in r.choices] == [0, 1]
    prompt_tokens = len(engine.tokenize(engine.apply_chat_template(messages)))
    assert r.usage.prompt_tokens == prompt_tokens  # once, not per choice
    assert computed <= prompt_tokens + 1  # prefilled once; the second choice recomputed only the last token
    again = client.chat.completions.create(n=2, **kw)
    assert [c.message.content for c in again.choices] == [a, b]  # reproducible per choice
    single = client.chat.completions.create(n=1, **kw)
    assert single.choices[0].message.content == a  # choice 0 uses the seed itself
    # streaming with n=2: both choices, each tagged with its index, same texts as non-streaming
    texts, finished = ["", ""], set()
    for chunk in client.chat.completions.create(
        n=2, stream=True, stream_options={"include_usage": True}, **kw
    ):
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finished.add(choice.index)
        if chunk.usage is not None:
            assert chunk.usage.prompt_tokens == prompt_tokens
    assert texts == [a, b] and finished == {0, 1}
    wait_idle(engine)
    engine.check_integrity()


def test_best_of_returns_the_most_likely(client) -> None:
    kw = {"model": "m", "prompt": "My favourite food is", "max_tokens": 5, "temperature": 1.0, "seed": 5}
    best = client.completions.create(best_of=3, logprobs=0, **kw).choices
    candidates = client.completions.create(n=3, logprobs=0, **kw).choices
    scores = [sum(c.logprobs.token_logprobs) for c in candidates]
    assert len(best) == 1 and best[0].text == candidates[scores.index(max(scores))].text
    with pytest.raises(openai.BadRequestError, match="best_of"):
        client.completions.create(best_of=1, n=2, **kw)
    with pytest.raises(openai.BadRequestError, match="best_of"):
        client.completions.create(best_of=3, stream=True, **kw)


def test_logit_bias_and_penalties_on_both_paths(client, http, engine) -> None:
    forced = engine.tokenize(" zebra")[0]
    bias = {str(forced): 100}
    r = client.completions.create(model="m", prompt=PROMPT, max_tokens=3, temperature=0, logit_bias=bias)
    native = http.post(
        "/generate",
        json={"text": PROMPT, "sampling_params": {"max_new_tokens": 3, "temperature": 0, "logit_bias": bias}},
    ).json()
    assert native["output_ids"] == [forced] * 3 and r.choices[0].text == engine.decode([forced] * 3)
    # repetition penalty: greedy output changes where the model repeats itself
    plain = http.post(
        "/generate", json={"text": PROMPT, "sampling_params": {"max_new_tokens": 24, "temperature": 0}}
    ).json()
    for field, value in (("repetition_penalty", 2.0), ("frequency_penalty", 2.0), ("presence_penalty", 2.0)):
        out = http.post(
            "/generate",
            json={"text": PROMPT, "sampling_params": {"max_new_tokens": 24, "temperature": 0, field: value}},
        ).json()
        assert out["output_ids"] != plain["output_ids"], field
        openai_name = {"repetition_penalty": "repetition_penalty"}.get(field, field)
        body = {"model": "m", "prompt": PROMPT, "max_tokens": 24, "temperature": 0, openai_name: value}
        via_openai = http.post("/v1/completions", json=body).json()
        assert via_openai["choices"][0]["text"] == out["text"], field
    for body in (
        {"logit_bias": {"abc": 1}},
        {"logit_bias": {"999999": 1}},
        {"frequency_penalty": 3},
        {"repetition_penalty": 0},
    ):
        for path, payload in (
            ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 1, **body}}),
            ("/v1/completions", {"prompt": "x", "max_tokens": 1, **body}),
        ):
            resp = http.post(path, json=payload)
            assert resp.status_code == 400 and next(iter(body)) in resp.json()["error"]["message"], (
                path,
                body,
            )


def test_min_tokens_on_both_paths(client, http, engine) -> None:
    messages = [{"role": "user", "content": "Say OK."}]
    text = engine.apply_chat_template(messages)
    short = http.post(
        "/generate", json={"text": text, "sampling_params": {"max_new_tokens": 60, "temperature": 0}}
    ).json()
    n = short["meta_info"]["completion_tokens"]
    assert short["meta_info"]["finish_reason"]["type"] == "stop" and n < 40
    longer = http.post(
        "/generate",
        json={
            "text": text,
            "sampling_params": {"max_new_tokens": 60, "temperature": 0, "min_new_tokens": n + 5},
        },
    ).json()
    assert longer["meta_info"]["completion_tokens"] >= n + 5
    r = client.chat.completions.create(
        model="m", messages=messages, max_tokens=60, temperature=0, extra_body={"min_tokens": n + 5}
    )
    assert r.usage.completion_tokens >= n + 5


def test_ebnf_grammar_on_both_paths(client, http) -> None:
    grammar = 'root ::= "yes" | "no"'
    out = http.post(
        "/generate",
        json={
            "text": "Is the sky blue? Answer:",
            "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ebnf": grammar},
        },
    ).json()
    assert out["text"] in ("yes", "no")
    r = client.completions.create(
        model="m", prompt="Is fire cold? Answer:", max_tokens=8, temperature=0, extra_body={"ebnf": grammar}
    )
    assert r.choices[0].text in ("yes", "no")
    for path, payload in (
        ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 1, "ebnf": "root ::= ((("}}),
        ("/v1/completions", {"prompt": "x", "max_tokens": 1, "ebnf": "root ::= ((("}),
    ):
        resp = http.post(path, json=payload)
        assert resp.status_code == 400 and "constraint" in resp.json()["error"]["message"]


def test_chat_template_kwargs_reach_the_template(http, engine) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    base = {"messages": messages, "max_tokens": 1, "temperature": 0}
    # SmolLM2's template has no variables of its own: an unused key changes nothing, a reserved one is refused
    same = http.post(
        "/v1/chat/completions", json={**base, "chat_template_kwargs": {"enable_thinking": False}}
    )
    assert same.status_code == 200
    resp = http.post("/v1/chat/completions", json={**base, "chat_template_kwargs": {"tokenize": True}})
    assert resp.status_code == 400 and "chat_template_kwargs" in resp.json()["error"]["message"]
    rendered = engine.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=False)
    assert rendered == engine.apply_chat_template(messages)


def test_continuous_usage_stats(client) -> None:
    chunks = list(
        client.completions.create(
            model="m",
            prompt="Hello",
            max_tokens=4,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
        )
    )
    with_choices = [c for c in chunks if c.choices]
    assert with_choices and all(c.usage is not None for c in with_choices)
    counts = [c.usage.completion_tokens for c in with_choices]
    assert counts == sorted(counts) and counts[-1] == 4 and chunks[-1].usage.completion_tokens == 4


def test_native_batch_with_a_sampling_params_list(http) -> None:
    body = {
        "text": ["One, two,", "Red, green,"],
        "sampling_params": [{"max_new_tokens": 2, "temperature": 0}, {"max_new_tokens": 5, "temperature": 0}],
    }
    outs = http.post("/generate", json=body).json()
    assert [o["meta_info"]["completion_tokens"] for o in outs] == [2, 5]
    bad = http.post("/generate", json={**body, "sampling_params": body["sampling_params"][:1]})
    assert bad.status_code == 400 and "sampling_params" in bad.json()["error"]["message"]
    single = http.post("/generate", json={"text": "x", "sampling_params": body["sampling_params"]})
    assert single.status_code == 400 and "sampling_params" in single.json()["error"]["message"]


def test_native_logprobs_stream_and_bad_values(http) -> None:
    body = {
        "text": PROMPT,
        "sampling_params": {"max_new_tokens": 3, "temperature": 0},
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": 2,
    }
    whole = http.post("/generate", json=body).json()["meta_info"]
    with http.stream("POST", "/generate", json={**body, "stream": True}) as resp:
        events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]
    last = events[-1]["meta_info"]
    for key in ("input_token_logprobs", "output_token_logprobs", "input_top_logprobs", "output_top_logprobs"):
        assert [list(x) if x else x for x in last[key]] == [list(x) if x else x for x in whole[key]], key
    assert all(math.isfinite(x[0]) for x in whole["output_token_logprobs"])
    for extra in ({"logprob_start_len": 10**6}, {"top_logprobs_num": 50}, {"logprob_start_len": -5}):
        resp = http.post("/generate", json={**body, **extra})
        assert resp.status_code == 400 and next(iter(extra)) in resp.json()["error"]["message"]
