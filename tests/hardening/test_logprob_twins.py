"""Issue 39, class 9: logprob requests with the same prompt (the choices of n > 1) share its prefill.
The first computes the whole prompt; its twins take the prompt from the tree and adopt the last
position's logits and the prompt logprobs, so they report the whole prompt cached and the very
numbers a request computing its prompt alone reports. Where the tree holds another copy of the
prompt (computed in other chunks) a twin computes its prompt itself, as before."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from runtime.server import ServerArgs, create_app
from tests.support.server_util import LiveServer

pytestmark = pytest.mark.slow

PROMPT = "The tide came in over the flats while the gulls argued about bread. " * 12
GREEDY = {"max_new_tokens": 6, "temperature": 0.0}
LOGPROBS = {"return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2}
NUMBERS = ("input_token_logprobs", "input_top_logprobs", "output_token_logprobs", "output_top_logprobs")


@pytest.fixture()
def fresh(engine: Any) -> Iterator[Any]:
    sibling = engine.sibling()
    yield sibling
    sibling.shutdown()


def numbers(result: dict[str, Any]) -> tuple[object, ...]:
    meta = result["meta_info"]
    return (result["output_ids"], *(meta[k] for k in NUMBERS))


def solo(engine: Any, **logprobs: Any) -> dict[str, Any]:
    """The same request on a cold cache: what every twin must report, bit for bit."""
    engine.flush_cache()
    out = engine.generate(PROMPT, sampling_params=GREEDY, **(LOGPROBS | logprobs))
    engine.flush_cache()
    return out


def test_choices_compute_the_prompt_once_and_report_its_bits(fresh: Any) -> None:
    # the baseline decodes four rows per step too (a step's row count rounds the sixth digit)
    cold = fresh.generate([PROMPT] * 4, sampling_params=GREEDY, prefix_cache=False, **LOGPROBS)
    prompt_len = cold[0]["meta_info"]["prompt_tokens"]
    assert [c["meta_info"]["cached_tokens"] for c in cold] == [0] * 4
    fresh.flush_cache()
    results = fresh.generate([PROMPT] * 4, sampling_params=GREEDY, **LOGPROBS)
    cached = sorted(r["meta_info"]["cached_tokens"] for r in results)
    assert cached == [0, prompt_len, prompt_len, prompt_len]
    assert [numbers(r) for r in results] == [numbers(c) for c in cold]
    assert [r["meta_info"]["prefix_cache"] for r in results].count(True) == 3
    fresh.check_integrity()


def test_a_later_twin_adopts_after_the_first_finished(fresh: Any) -> None:
    cold = solo(fresh)
    first = fresh.generate(PROMPT, sampling_params=GREEDY, **LOGPROBS)
    later = fresh.generate(PROMPT, sampling_params=GREEDY, **LOGPROBS)
    assert first["meta_info"]["cached_tokens"] == 0
    assert later["meta_info"]["cached_tokens"] == later["meta_info"]["prompt_tokens"]
    assert numbers(first) == numbers(later) == numbers(cold)
    # a later start (fewer prompt positions reported) is covered too, with the same numbers
    start = 40
    cold_tail = solo(fresh, logprob_start_len=start)
    fresh.generate(PROMPT, sampling_params=GREEDY, **LOGPROBS)
    tail = fresh.generate(PROMPT, sampling_params=GREEDY, **(LOGPROBS | {"logprob_start_len": start}))
    assert tail["meta_info"]["cached_tokens"] == tail["meta_info"]["prompt_tokens"]
    assert numbers(tail) == numbers(cold_tail)
    fresh.check_integrity()


def test_another_top_k_is_not_a_twin(fresh: Any) -> None:
    # a longer or shorter top list cut from the first one's could order ties differently
    other = LOGPROBS | {"top_logprobs_num": 3}
    cold = solo(fresh, **other)
    fresh.generate(PROMPT, sampling_params=GREEDY, **LOGPROBS)
    out = fresh.generate(PROMPT, sampling_params=GREEDY, **other)
    assert out["meta_info"]["cached_tokens"] == 0 and numbers(out) == numbers(cold)
    fresh.check_integrity()


def test_a_prompt_only_request_leaves_a_twin(fresh: Any) -> None:
    cold = solo(fresh)
    fresh.generate(PROMPT, sampling_params={"max_new_tokens": 0}, **LOGPROBS)
    out = fresh.generate(PROMPT, sampling_params=GREEDY, **LOGPROBS)
    assert out["meta_info"]["cached_tokens"] == out["meta_info"]["prompt_tokens"]
    assert numbers(out) == numbers(cold)
    fresh.check_integrity()


def test_another_copy_in_the_tree_or_a_flush_means_no_twin(fresh: Any) -> None:
    cold = solo(fresh)
    # a plain request publishes the prompt first: the logprob request computes its own copy, and
    # the tree keeps the older one, so nothing is remembered and the next one computes again
    fresh.generate(PROMPT, sampling_params=GREEDY)
    outs = [fresh.generate(PROMPT, sampling_params=GREEDY, **LOGPROBS) for _ in range(2)]
    assert [o["meta_info"]["cached_tokens"] for o in outs] == [0, 0]
    assert all(numbers(o) == numbers(cold) for o in outs)
    fresh.flush_cache()
    fresh.generate(PROMPT, sampling_params=GREEDY, **LOGPROBS)
    fresh.flush_cache()  # the remembered logits stay, the KV beside them is gone
    after = fresh.generate(PROMPT, sampling_params=GREEDY, **LOGPROBS)
    assert after["meta_info"]["cached_tokens"] == 0 and numbers(after) == numbers(cold)
    fresh.check_integrity()


def test_salts_do_not_share_twins(fresh: Any) -> None:
    fresh.flush_cache()
    fresh.generate(PROMPT, sampling_params=GREEDY, cache_salt="tenant-a", **LOGPROBS)
    other = fresh.generate(PROMPT, sampling_params=GREEDY, cache_salt="tenant-b", **LOGPROBS)
    same = fresh.generate(PROMPT, sampling_params=GREEDY, cache_salt="tenant-a", **LOGPROBS)
    assert other["meta_info"]["cached_tokens"] == 0
    assert same["meta_info"]["cached_tokens"] == same["meta_info"]["prompt_tokens"]
    fresh.check_integrity()


@pytest.fixture()
def live(fresh: Any) -> Iterator[tuple[LiveServer, Any]]:
    with LiveServer(create_app(fresh, ServerArgs())) as server:
        yield server, fresh


def test_n_choices_over_http_share_the_prefill(live: tuple[LiveServer, Any]) -> None:
    server, engine = live
    engine.flush_cache()
    before = engine.get_cache_stats()
    body = {"prompt": PROMPT, "n": 4, "logprobs": 2, "echo": True, "max_tokens": 5, "temperature": 0}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=600)
    assert r.status_code == 200, r.text
    out = r.json()
    logprobs = [c["logprobs"] for c in out["choices"]]
    assert len(logprobs) == 4 and all(lp == logprobs[0] for lp in logprobs)
    after = engine.get_cache_stats()
    # the prompt computed once for four choices (was four times)
    computed = after["prefill_tokens_computed"] - before["prefill_tokens_computed"]
    assert computed == out["usage"]["prompt_tokens"]
