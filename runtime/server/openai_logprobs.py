"""OpenAI's logprob shapes built from the engine's SGLang-shaped `meta_info`, and what the OpenAI
routes ask the engine for (n > 1 seeds, best_of, logprob arguments).

Chat: `choice.logprobs = {"content": [{token, logprob, bytes, top_logprobs: [...]}], "refusal": None}`.
Completions: `choice.logprobs = {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}`,
with the prompt's tokens first under `echo` (the first has logprob None, as OpenAI's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runtime.server.errors import ApiError
from runtime.server.schemas import ChatCompletionRequest, CompletionRequest, _OpenAIBase

SEED_SPACE = 2**64


def engine_logprob_kwargs(req: _OpenAIBase) -> dict[str, object]:
    """SGLang's logprob arguments for this OpenAI request ({} when it wants none)."""
    if isinstance(req, ChatCompletionRequest):
        if req.top_logprobs is not None and not req.logprobs:
            raise ApiError(400, "top_logprobs: requires logprobs to be true")
        if not req.logprobs:
            return {}
        return {
            "return_logprob": True,
            "top_logprobs_num": req.top_logprobs or 0,
            "return_text_in_logprobs": True,
        }
    assert isinstance(req, CompletionRequest)
    if req.logprobs is None:
        return {}
    kwargs: dict[str, object] = {
        "return_logprob": True,
        "top_logprobs_num": req.logprobs,
        "return_text_in_logprobs": True,
    }
    if req.echo:
        kwargs["logprob_start_len"] = 0  # the prompt's logprobs, as OpenAI's echo returns them
    return kwargs


def candidates(req: _OpenAIBase) -> int:
    """Samples drawn per prompt: `best_of` when given (the best `n` are returned), else `n`."""
    best_of = getattr(req, "best_of", None)
    if best_of is None:
        return req.n
    if best_of < req.n:
        raise ApiError(400, f"best_of: must be >= n ({req.n})")
    if best_of > req.n and req.stream:
        raise ApiError(400, "best_of: cannot be combined with stream (candidates are ranked when complete)")
    return best_of


def choice_sampling(sampling: Mapping[str, Any], index: int) -> Mapping[str, Any]:
    """Sampling params of choice `index`: with a seed, each choice has its own reproducible stream."""
    if index == 0 or sampling.get("seed") is None:
        return sampling
    return {**sampling, "seed": (sampling["seed"] + index) % SEED_SPACE}


def best(outs: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The `n` candidates with the highest cumulative output logprob (ties: drawing order)."""
    if len(outs) == n:
        return outs
    ranked = sorted(range(len(outs)), key=lambda i: -_cumulative(outs[i]))
    return [outs[i] for i in sorted(ranked[:n])]


def _cumulative(out: dict[str, Any]) -> float:
    """Summed over the tokens the response shows (a matched stop token is not one of them)."""
    return sum(lp for lp, _, _ in _output_entries(out["meta_info"])[0] if lp is not None)


def _output_entries(meta: dict[str, Any]) -> tuple[list[tuple], list[Any]]:
    """Output tokens that make up the text: a matched stop token is not part of it."""
    tokens = list(meta.get("output_token_logprobs") or [])
    tops = list(meta.get("output_top_logprobs") or [None] * len(tokens))
    reason = meta.get("finish_reason") or {}
    if tokens and isinstance(reason, dict) and isinstance(reason.get("matched"), int):
        tokens, tops = tokens[:-1], tops[:-1]
    return tokens, tops


def _entry(triple: tuple, top: list[tuple] | None) -> dict[str, object]:
    logprob, _, text = triple
    return {
        "token": text,
        "logprob": logprob,
        "bytes": list(text.encode("utf-8")),
        "top_logprobs": [
            {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))} for lp, _, t in top or []
        ],
    }


def chat_logprobs(meta: dict[str, Any], start: int = 0) -> dict[str, Any] | None:
    """`choice.logprobs` for chat, from output token `start` on (streams send the new ones).
    None when the request asked for none."""
    if "output_token_logprobs" not in meta:
        return None
    tokens, tops = _output_entries(meta)
    return {
        "content": [_entry(t, top) for t, top in list(zip(tokens, tops, strict=True))[start:]],
        "refusal": None,
    }


def completion_logprobs(
    meta: dict[str, Any], echo: bool, start: int = 0, offset: int = 0
) -> dict[str, Any] | None:
    """`choice.logprobs` for completions (prompt tokens first under echo). `offset` is the text
    offset of the first token listed."""
    if "output_token_logprobs" not in meta:
        return None
    tokens, tops = _output_entries(meta)
    if echo:
        prompt = list(meta.get("input_token_logprobs") or [])
        prompt_tops = list(meta.get("input_top_logprobs") or [None] * len(prompt))
        tokens, tops = prompt + tokens, prompt_tops + tops
    tokens, tops = tokens[start:], tops[start:]
    offsets, at = [], offset
    for _, _, text in tokens:
        offsets.append(at)
        at += len(text)
    return {
        "tokens": [text for _, _, text in tokens],
        "token_logprobs": [lp for lp, _, _ in tokens],
        "top_logprobs": [None if top is None else {t: lp for lp, _, t in top} for top in tops],
        "text_offset": offsets,
    }


def prompt_logprobs(meta: dict[str, Any]) -> dict[str, Any] | None:
    """Completion logprobs of the echoed prompt alone (a stream's first chunk under echo)."""
    full = completion_logprobs(meta, True)
    if full is None:
        return None
    count = len(meta.get("input_token_logprobs") or [])
    return {key: values[:count] for key, values in full.items()}
