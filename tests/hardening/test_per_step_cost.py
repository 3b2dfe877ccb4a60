"""Issue 39, class 6: logit_bias and stop strings cost a step the same whatever their size allows:
the bias is built once and added in one index_add (equal to adding each entry), and a stop search
reads only the new tail of the text (a stop that ends late in a long output still stops it)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from runtime.engine.sampling import MAX_LOGIT_BIAS, Sampler, SamplingParams


@pytest.mark.parametrize("entries", [1, 17, MAX_LOGIT_BIAS])
def test_bias_added_at_once_equals_each_entry_added(entries: int) -> None:
    g = torch.Generator().manual_seed(entries)
    vocab = 49152
    ids = torch.randperm(vocab, generator=g)[:entries].tolist()
    bias = {str(i) if n % 2 else i: float(n % 200 - 100) for n, i in enumerate(ids)}
    logits = torch.randn(vocab, generator=g)
    expected = logits.clone()
    for key, value in bias.items():
        expected[int(key)] += value
    sampler = Sampler(SamplingParams(logit_bias=bias, max_new_tokens=4))
    for _ in range(3):  # built once, the same every step
        assert torch.equal(sampler.adjust(logits), expected)
    assert torch.equal(logits, logits.clone())  # the input row is not changed


@pytest.mark.slow
@pytest.mark.parametrize("stop_at", [40, 200])
def test_a_stop_string_late_in_a_long_output_still_stops_it(engine: Any, stop_at: int) -> None:
    """The stop is the text the model writes around token `stop_at` (several tokens long), taken
    from a greedy run without it, so the search window must find it where it ends."""
    prompt = "Write the numbers from one to five hundred, separated by commas:"
    greedy = {"temperature": 0, "ignore_eos": True}
    free = engine.generate(prompt=prompt, sampling_params={**greedy, "max_new_tokens": stop_at + 20})
    text_before = engine.decode(free["output_ids"][:stop_at])
    stop = engine.decode(free["output_ids"][stop_at : stop_at + 8])
    assert stop.strip() and free["text"].index(stop) >= len(text_before) - 8  # first seen there
    stops = [f"never-{i}-" * 16 for i in range(63)] + [stop]  # 63 long stops that never match
    out = engine.generate(
        prompt=prompt, sampling_params={**greedy, "max_new_tokens": stop_at + 20, "stop": stops}
    )
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["text"] == free["text"][: free["text"].index(stop)]
