"""LogprobState.meta_info builds each reported row once: a stream asks for the rows at every step,
and rebuilding them (a tokenizer decode per token and per top entry) made each step O(length)."""

from __future__ import annotations

import torch

from runtime.engine.logprobs import LogprobSpec, LogprobState, PrefillRecord


class CountingTokenizer:
    def __init__(self) -> None:
        self.calls = 0

    def decode(self, ids: list[int]) -> str:
        self.calls += 1
        return "".join(f"<{i}>" for i in ids)


def _fresh_meta(state: LogprobState, input_ids, output_ids, tok) -> dict:
    """What a state that never built rows reports (the reference)."""
    copy = LogprobState(state.spec, state.prompt_len)
    copy.input_vals, copy.input_top = list(state.input_vals), list(state.input_top)
    copy.output_vals, copy.output_top = list(state.output_vals), list(state.output_top)
    return copy.meta_info(input_ids, output_ids, tok)


def _step(state: LogprobState, output_ids: list[int], step: int) -> None:
    logits = torch.arange(16, dtype=torch.float32).roll(step)
    logprobs = torch.log_softmax(logits, dim=-1)
    token = int(logprobs.argmax())
    state.record_output(logprobs, token)
    output_ids.append(token)


def test_rows_built_once_and_equal_to_a_fresh_build() -> None:
    tok = CountingTokenizer()
    input_ids = list(range(100, 130))
    state = LogprobState(LogprobSpec(start=2, top_n=3, with_text=True), len(input_ids))
    state.record_prompt(torch.randn(len(input_ids) - 2, 16), 2, [i % 16 for i in input_ids])
    output_ids: list[int] = []
    metas = []
    for step in range(200):
        _step(state, output_ids, step)
        metas.append(state.meta_info(input_ids, output_ids, tok))
    # every distinct token decoded once: the prompt's, and the 16 the outputs and tops can hold
    assert tok.calls <= len(set(input_ids)) + 16
    final = metas[-1]
    assert final == _fresh_meta(state, input_ids, output_ids, CountingTokenizer())
    assert len(final["output_token_logprobs"]) == final["output_token_logprobs_length"] == 200
    # an earlier result is not changed by later steps (each call returns new lists)
    assert len(metas[0]["output_token_logprobs"]) == 1 and len(metas[0]["output_top_logprobs"]) == 1


def test_adopting_a_twin_rebuilds_the_prompt_rows() -> None:
    tok = CountingTokenizer()
    input_ids = list(range(10))
    spec = LogprobSpec(start=0, top_n=2, with_text=True)
    state = LogprobState(spec, len(input_ids))
    before = state.meta_info(input_ids, [], tok)  # the first position only, no logprob
    assert before["input_token_logprobs"] == [(None, 0, "<0>")]
    twin_vals = (None, *[-float(i) for i in range(1, 10)])
    twin_top = (None, *[[(-0.5, 3), (-1.0, 4)]] * 9)
    record = PrefillRecord(torch.zeros(16), spec, twin_vals, twin_top, node=None, weights_version=0)  # type: ignore[arg-type]
    state.adopt(record)
    after = state.meta_info(input_ids, [], tok)
    assert [v for v, _, _ in after["input_token_logprobs"]] == list(twin_vals)
    assert after == _fresh_meta(state, input_ids, [], CountingTokenizer())


def test_without_text_no_decode() -> None:
    tok = CountingTokenizer()
    state = LogprobState(LogprobSpec(start=5, top_n=0, with_text=False), 5)
    output_ids: list[int] = []
    for step in range(20):
        _step(state, output_ids, step)
        meta = state.meta_info(list(range(5)), output_ids, tok)
    assert tok.calls == 0 and all(text is None for _, _, text in meta["output_token_logprobs"])
    assert "output_top_logprobs" not in meta
