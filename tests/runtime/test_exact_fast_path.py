"""The exact fast path (#37): int4wo-32 weights with bf16 or int8 KV, no flag, give every prompt's
greedy output and the logits behind it the same bits cold, cached (the whole prompt or part of
it), batched with other requests, and split into other chunks.

Logits are compared through the output logprobs with the top 5 alternatives of every step
(log-softmax of the step's whole logits row: a last-bit change in any logit moves them), with
`==` on floats, not a tolerance."""

from __future__ import annotations

import pytest

from tests.runtime.conftest import essay_text

#: 20 prompt lengths from 16 to 4,000 tokens, about geometric (most work is in the long ones)
LENGTHS = [16, 21, 28, 38, 50, 67, 89, 118, 157, 209, 278, 370, 492, 654, 870, 1157, 1539, 2047, 2722, 4000]
PARAMS = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}
LOGPROBS = {"return_logprob": True, "top_logprobs_num": 5}


def _prompts(engine) -> list[list[int]]:
    """Prefixes of one long document, each with a question of its own: a longer prompt shares
    the shorter ones' document (a partial cache hit when they ran before)."""
    doc = engine.tokenize(essay_text())
    doc = (doc * (4100 // len(doc) + 1))[:4100]
    out = []
    for i, n in enumerate(LENGTHS):
        question = engine.tokenize(f"\nQuestion {i}: what does the text above say next?\nAnswer:")
        out.append(doc[: n - len(question)] + question if n > len(question) + 4 else doc[:n])
    assert [len(p) for p in out] == LENGTHS
    return out


def _numbers(result: dict, top: int = 5) -> tuple:
    meta = result["meta_info"]
    tops = [step[:top] for step in meta["output_top_logprobs"]]
    return result["output_ids"], meta["output_token_logprobs"], tops


@pytest.mark.slow
@pytest.mark.parametrize("kv_cache_dtype", ["bfloat16", "int8"])
def test_outputs_and_logits_are_the_same_bits_cold_cached_batched_and_chunked(int4_engine, kv_cache_dtype):
    eng = int4_engine.sibling(kv_cache_dtype=kv_cache_dtype, max_total_tokens=20000)
    chunked = int4_engine.sibling(
        kv_cache_dtype=kv_cache_dtype, max_total_tokens=8192, chunked_prefill_size=300
    )
    prompts = _prompts(eng)
    try:
        assert eng.model.exact(False, eng.scheduler.decode_kernel), "the default path is the exact one"
        cold = [
            _numbers(eng.generate(input_ids=p, sampling_params=PARAMS, prefix_cache=False, **LOGPROBS))
            for p in prompts
        ]
        partial, whole = [], []
        for p in prompts:  # shortest first: each finds the shorter ones' document cached
            partial.append(eng.generate(input_ids=p, sampling_params=PARAMS, **LOGPROBS))
        for p in prompts:  # another top-k: no logprob twin, the last token is recomputed
            whole.append(
                eng.generate(input_ids=p, sampling_params=PARAMS, **(LOGPROBS | {"top_logprobs_num": 4}))
            )
        eng.flush_cache()
        batched = eng.generate(input_ids=prompts, sampling_params=PARAMS, prefix_cache=False, **LOGPROBS)
        split = [
            chunked.generate(input_ids=p, sampling_params=PARAMS, prefix_cache=False, **LOGPROBS)
            for p in prompts
        ]
    finally:
        eng.shutdown()
        chunked.shutdown()
    hits = [r["meta_info"]["cached_tokens"] for r in partial]
    assert sum(h > 0 for h in hits) >= 15, hits
    assert [r["meta_info"]["cached_tokens"] for r in whole] == [n - 1 for n in LENGTHS]
    for name, runs in (("partial", partial), ("whole", whole), ("batched", batched), ("chunked", split)):
        for i, r in enumerate(runs):
            top = 4 if name == "whole" else 5
            assert _numbers(r, top) == (*cold[i][:2], [step[:top] for step in cold[i][2]]), (name, LENGTHS[i])
