"""A live server over a deterministic engine reports the flag in /get_server_info and serves a
logprob request from the cache (up to logprob_start_len) with an uncached run's numbers."""

from __future__ import annotations

import httpx
import pytest

from runtime.server import ServerArgs, create_app
from tests.support.server_util import LiveServer


@pytest.mark.slow
def test_server_reports_the_flag_and_logprobs_hit_the_cache(engine):
    sibling = engine.sibling(enable_deterministic_inference=True, max_total_tokens=2048)
    body = {
        "text": "The capital of France is a city that people love to visit because",
        "sampling_params": {"max_new_tokens": 6, "temperature": 0},
        "return_logprob": True,
        "logprob_start_len": 6,
    }
    try:
        with LiveServer(create_app(sibling, ServerArgs())) as live:
            info = httpx.get(f"{live.url}/get_server_info", timeout=30).json()
            cold = httpx.post(f"{live.url}/generate", json=body, timeout=120).json()
            # another top-k is not the first one's twin: served up to logprob_start_len, as SGLang
            other = httpx.post(
                f"{live.url}/generate", json=body | {"top_logprobs_num": 1}, timeout=120
            ).json()
            sibling.flush_cache()
            httpx.post(f"{live.url}/generate", json=body | {"top_logprobs_num": 1}, timeout=120).json()
            warm = httpx.post(f"{live.url}/generate", json=body | {"top_logprobs_num": 1}, timeout=120).json()
            twin = httpx.post(f"{live.url}/generate", json=body | {"top_logprobs_num": 1}, timeout=120).json()
    finally:
        sibling.shutdown()
    assert info["enable_deterministic_inference"] is True
    assert info["engine_config"]["enable_deterministic_inference"] is True
    prompt = cold["meta_info"]["prompt_tokens"]
    assert cold["meta_info"]["cached_tokens"] == 0 and other["meta_info"]["cached_tokens"] == 6
    # the same request again is a twin of the last (tests/hardening/test_logprob_twins.py): whole
    assert warm["meta_info"]["cached_tokens"] == twin["meta_info"]["cached_tokens"] == prompt
    assert warm["text"] == cold["text"] == other["text"]
    for key in ("input_token_logprobs", "output_token_logprobs"):
        assert other["meta_info"][key] == cold["meta_info"][key], key
        assert warm["meta_info"][key] == twin["meta_info"][key] == other["meta_info"][key], key
