"""Logprobs from the embedded engine: SGLang's shapes and semantics, and the same numbers whatever
the prefix cache served (compared bit for bit with a `prefix_cache=False` run)."""

from __future__ import annotations

import math

import pytest

from runtime.errors import InvalidRequest

pytestmark = pytest.mark.slow

BASE = "The quick brown fox jumps over the lazy dog. " * 8
GREEDY = {"max_new_tokens": 4, "temperature": 0}
KEYS = ("input_token_logprobs", "output_token_logprobs", "input_top_logprobs", "output_top_logprobs")


def _lp(engine, prompt: str, **kw):
    return engine.generate(
        prompt=prompt, sampling_params=kw.pop("sampling", GREEDY), return_logprob=True, **kw
    )


def test_shapes_and_start_semantics(engine) -> None:
    prompt = BASE + "Then it ran"
    ids = engine.tokenize(prompt)
    n = len(ids)
    full = _lp(engine, prompt, logprob_start_len=0, top_logprobs_num=3, return_text_in_logprobs=True)[
        "meta_info"
    ]
    inputs = full["input_token_logprobs"]
    assert len(inputs) == n and [t for _, t, _ in inputs] == ids
    assert inputs[0][0] is None and full["input_top_logprobs"][0] is None  # SGLang: the first has none
    assert all(lp <= 0 for lp, _, _ in inputs[1:]) and inputs[1][2] == engine.decode([ids[1]])
    for (lp, tid, _), top in zip(inputs[1:], full["input_top_logprobs"][1:], strict=True):
        assert len(top) == 3 and top[0][0] >= top[1][0] >= top[2][0] >= -1e30
        assert lp <= top[0][0] + 1e-6 and (tid != top[0][1] or lp == top[0][0])
    outputs = full["output_token_logprobs"]
    assert [t for _, t, _ in outputs] == engine.generate(prompt=prompt, sampling_params=GREEDY)["output_ids"]
    for (lp, tid, _), top in zip(outputs, full["output_top_logprobs"], strict=True):
        assert top[0][1] == tid and top[0][0] == lp  # greedy: the chosen token is the top one
    assert full["output_token_logprobs_length"] == len(outputs)
    # a later start reports the tail only, the first entry again without a logprob
    tail = _lp(engine, prompt, logprob_start_len=n - 3, prefix_cache=False)["meta_info"]
    assert [t for _, t, _ in tail["input_token_logprobs"]] == ids[n - 3 :]
    assert tail["input_token_logprobs"][0][0] is None
    # same numbers up to rounding (the logits of 3 rows and of n rows are computed by different kernels)
    assert [x[0] for x in tail["input_token_logprobs"][1:]] == pytest.approx(
        [x[0] for x in inputs[n - 2 :]], abs=1e-4
    )
    assert tail["input_token_logprobs"][0][2] is None  # no text unless return_text_in_logprobs
    assert "input_top_logprobs" not in tail  # top_logprobs_num = 0
    # default (-1) and start == len: output logprobs only
    for start in (None, -1, n):
        meta = _lp(engine, prompt, logprob_start_len=start)["meta_info"]
        assert meta["input_token_logprobs"] == [] and len(meta["output_token_logprobs"]) == 4
    plain = engine.generate(prompt=prompt, sampling_params=GREEDY)["meta_info"]
    assert "output_token_logprobs" not in plain


def test_prompt_logprobs_sum_to_the_sequence_likelihood(engine) -> None:
    """The logprob of a continuation scored as prompt equals the sampled tokens' output logprobs."""
    prompt = BASE + "Then"
    out = _lp(engine, prompt)
    again = _lp(engine, prompt + out["text"], logprob_start_len=len(engine.tokenize(prompt)) - 1)["meta_info"]
    scored = [lp for lp, _, _ in again["input_token_logprobs"][1:]]
    sampled = [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
    if [t for _, t, _ in again["input_token_logprobs"][1:]] == out["output_ids"]:  # tokenization round-trips
        assert scored == pytest.approx(sampled, abs=1e-4)


@pytest.mark.parametrize("start_from_end", [None, 2, 6, 40, 1000])
def test_logprobs_identical_with_cache_on_and_off(engine, start_from_end) -> None:
    warm = BASE + "Then it ran into the forest"
    prompt = BASE + "Then it ran into the river and swam"
    engine.generate(prompt=warm, sampling_params=GREEDY)  # the shared prefix is in the tree
    n = len(engine.tokenize(prompt))
    start = -1 if start_from_end is None else max(n - start_from_end, 0)
    kw = {"logprob_start_len": start, "top_logprobs_num": 5}
    cached = _lp(engine, prompt, **kw)["meta_info"]
    cold = _lp(engine, prompt, prefix_cache=False, **kw)["meta_info"]
    assert cold["cached_tokens"] == 0 and cached["cached_tokens"] == 0  # a logprob request reads no cache
    for key in KEYS:
        assert cached[key] == cold[key], key  # bit for bit, float32
    # ... but it publishes its prompt: a plain request hits it
    assert engine.generate(prompt=prompt, sampling_params=GREEDY)["meta_info"]["cached_tokens"] == n - 1
    engine.check_integrity()


def test_long_prompt_chunked_identical(engine, document) -> None:
    """Chunked prefill (prompt > chunked_prefill_size) after a 1.4k-token prefix was cached."""
    engine.generate(prompt=document + "\nQ: what?", sampling_params=GREEDY)
    prompt = document + "\nQuestion: who wrote this? Answer:"
    n = len(engine.tokenize(prompt))
    assert n > engine.config.chunked_prefill_size
    for start in (0, n - 30, -1):
        cached = _lp(engine, prompt, logprob_start_len=start, top_logprobs_num=2)["meta_info"]
        cold = _lp(engine, prompt, logprob_start_len=start, top_logprobs_num=2, prefix_cache=False)[
            "meta_info"
        ]
        for key in KEYS:
            assert cached[key] == cold[key], (start, key)


def test_batch_with_per_prompt_logprob_arguments(engine) -> None:
    prompts = [BASE + "One", BASE + "Two two"]
    outs = engine.generate(
        prompt=prompts,
        sampling_params=[GREEDY, {**GREEDY, "max_new_tokens": 2}],
        return_logprob=[True, False],
        logprob_start_len=[0, 0],
        top_logprobs_num=[2, 0],
    )
    assert len(outs[0]["meta_info"]["input_token_logprobs"]) == len(engine.tokenize(prompts[0]))
    assert (
        "input_token_logprobs" not in outs[1]["meta_info"] and outs[1]["meta_info"]["completion_tokens"] == 2
    )


def test_sampled_output_logprobs_use_the_temperature(engine) -> None:
    """SGLang's default: a sampled token's logprob is log_softmax(logits / temperature)."""
    prompt = BASE + "Then"
    hot = _lp(
        engine, prompt, sampling={"max_new_tokens": 1, "temperature": 2.0, "seed": 3}, top_logprobs_num=1
    )
    cold = _lp(engine, prompt, sampling={"max_new_tokens": 1, "temperature": 0}, top_logprobs_num=1)
    top_hot = hot["meta_info"]["output_top_logprobs"][0][0]
    top_cold = cold["meta_info"]["output_top_logprobs"][0][0]
    assert top_hot[1] == top_cold[1] and top_hot[0] < top_cold[0]  # flatter: the top token's logprob drops
    assert math.isfinite(hot["meta_info"]["output_token_logprobs"][0][0])


def test_bad_logprob_arguments(engine) -> None:
    n = len(engine.tokenize("hello there"))
    for kw in (
        {"logprob_start_len": n + 1},
        {"logprob_start_len": -2},
        {"top_logprobs_num": 21},
        {"top_logprobs_num": -1},
    ):
        with pytest.raises(InvalidRequest):
            engine.generate(prompt="hello there", sampling_params=GREEDY, return_logprob=True, **kw)
    with pytest.raises(InvalidRequest):
        engine.generate(prompt="hello", sampling_params=GREEDY, return_logprobs=True)  # misspelt
    engine.check_integrity()
