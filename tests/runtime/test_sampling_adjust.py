"""logit_bias, SGLang's penalties and min_new_tokens on a logits row (no model needed)."""

from __future__ import annotations

import pytest
import torch

from runtime.engine.sampling import Sampler, SamplingParams
from runtime.errors import InvalidRequest

EOS = 7


def _sampler(**params) -> Sampler:
    return Sampler(SamplingParams(**params), stop_ids={EOS})


def test_nothing_to_apply_returns_the_row_itself() -> None:
    logits = torch.randn(16)
    assert _sampler().adjust(logits) is logits


def test_logit_bias_adds_to_the_named_tokens() -> None:
    logits = torch.zeros(16)
    out = _sampler(logit_bias={"3": 5.0, 4: -100}).adjust(logits)
    assert out[3] == 5.0 and out[4] == -100 and out[0] == 0 and logits[3] == 0  # input untouched
    assert _sampler(logit_bias={"3": 5.0}, temperature=0)(out) == 3


def test_penalties_follow_sglang() -> None:
    logits = torch.tensor([2.0, -2.0, 1.0, 0.5])
    s = _sampler(frequency_penalty=0.5, presence_penalty=0.25, repetition_penalty=2.0)
    assert torch.equal(s.adjust(logits), logits)  # nothing generated yet: nothing to penalize
    for token in (0, 0, 1):
        s.observe(token, 4)
    out = s.adjust(logits)
    # repetition: positive / 2, negative * 2; then frequency * count and presence once
    assert out.tolist() == pytest.approx([2.0 / 2 - 0.5 * 2 - 0.25, -2.0 * 2 - 0.5 - 0.25, 1.0, 0.5])


def test_min_new_tokens_holds_back_end_of_sequence_and_stop_ids() -> None:
    logits = torch.zeros(16)
    logits[EOS] = 10
    logits[9] = 9
    s = Sampler(SamplingParams(min_new_tokens=2, stop_token_ids=(9,), temperature=0), stop_ids={EOS})
    first = s.adjust(logits)
    assert first[EOS] == float("-inf") and first[9] == float("-inf")
    s.observe(int(s(first)), 16)
    s.observe(int(s(s.adjust(logits))), 16)
    assert s(s.adjust(logits)) == EOS  # two generated: the end is allowed again


def test_logprobs_divide_by_temperature_unless_greedy() -> None:
    logits = torch.tensor([1.0, 2.0, 3.0])
    assert torch.allclose(_sampler(temperature=0).logprobs(logits), torch.log_softmax(logits, -1))
    assert torch.allclose(_sampler(temperature=0.5).logprobs(logits), torch.log_softmax(logits / 0.5, -1))


@pytest.mark.parametrize(
    "params",
    [
        {"frequency_penalty": 2.5},
        {"presence_penalty": -3},
        {"repetition_penalty": 0},
        {"repetition_penalty": 2.5},
        {"min_new_tokens": -1},
        {"logit_bias": {"x": 1.0}},
        {"logit_bias": {"-1": 1.0}},
        {"logit_bias": {"\u00b2": 1.0}},
        {"logit_bias": {"1": float("inf")}},
        {"logit_bias": {"1": 101}},
        {"regex": "a", "ebnf": 'root ::= "a"'},
    ],
)
def test_bad_values_are_invalid_requests(params) -> None:
    with pytest.raises(InvalidRequest):
        SamplingParams.from_dict(params)


def test_min_tokens_is_an_alias() -> None:
    assert SamplingParams.from_dict({"min_tokens": 3}).min_new_tokens == 3


def test_a_steps_batched_argmax_is_each_rows_greedy_pick_and_yields_to_a_grammar_mask() -> None:
    """The scheduler takes every row's argmax in one op; a greedy row's token is that one, and
    a grammar's mask still decides where it applies."""
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(3))
    logits[2, 10] = logits[2, 11] = logits[2].max() + 1  # a tie: the first index, as torch.argmax
    best = logits.argmax(dim=-1).tolist()
    greedy = _sampler(temperature=0)
    for row in range(5):
        assert greedy(logits[row], None, best[row]) == int(torch.argmax(logits[row])) == best[row]
    mask = torch.zeros(50, dtype=torch.bool)
    mask[3] = True
    assert greedy(logits[0], mask, best[0]) == 3
