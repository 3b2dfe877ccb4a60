"""`enable_deterministic_inference`: batch-invariant attention and matmuls (runtime/model/attention.py).

Without it a token's logits carry a few different last bits depending on how many tokens share
its forward call (SDPA's and MKL's blocking); with bf16 activations that flips greedy choices.
With it the bits are the same however a sequence is chunked, cached or batched: these tests
compare bits (torch.equal), not tolerances."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from runtime.cache.seq_kv import SeqKV
from runtime.model.attention import BLOCK, InvariantAttention, padded_length
from runtime.model.model import Segment
from runtime.server.args import build_parser, engine_config
from tests.runtime.conftest import chat

HEADS, KV_HEADS, HD = 9, 3, 64


def _padded(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """x [KVH, L, hd] followed by arbitrary finite rows up to whole blocks (what other requests
    leave in the pool): attention must not depend on them."""
    extra = padded_length(x.shape[1]) - x.shape[1]
    return torch.cat([x, torch.randn(x.shape[0], extra, x.shape[2], generator=g) * 50], 1)


@pytest.mark.parametrize("length", [1, 3, 63, 64, 65, 200, 700])
def test_attention_bits_do_not_depend_on_chunking(length):
    g = torch.Generator().manual_seed(length)
    rng = random.Random(length)
    attend = InvariantAttention.build(HEADS, KV_HEADS, HD, "cpu")
    q = torch.randn(length, HEADS, HD, generator=g)
    k, v = torch.randn(KV_HEADS, length, HD, generator=g) * 2, torch.randn(KV_HEADS, length, HD, generator=g)
    whole = attend(q, _padded(k, g), _padded(v, g), 0)
    sdpa = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k[None], v[None], is_causal=True, enable_gqa=True
    )
    assert torch.allclose(whole, sdpa[0].transpose(0, 1).reshape(length, -1), atol=1e-5)
    for _ in range(8):  # random chunkings: prefill chunks, cache hits, single decode steps
        cuts = sorted(rng.sample(range(1, length), min(length - 1, rng.randint(1, 5)))) if length > 1 else []
        bounds = [0, *cuts, length]
        parts = [
            attend(q[a:b], _padded(k[:, :b], g), _padded(v[:, :b], g), a)
            for a, b in zip(bounds, bounds[1:], strict=False)
        ]
        assert torch.equal(torch.cat(parts), whole), bounds
    for p in rng.sample(range(length), min(length, 12)):  # one decode step at position p
        assert torch.equal(
            attend(q[p : p + 1], _padded(k[:, : p + 1], g), _padded(v[:, : p + 1], g), p)[0], whole[p]
        )


def _logits(
    model,
    ids: list[int],
    pieces: list[int],
    deterministic: bool,
    neighbour: list[int] | None = None,
    kernel=None,
):
    """Every position's logits of `ids`, fed in pieces of the given sizes (a neighbour request
    sharing each step when given), with the engine's native kernel when given: ([len(ids),
    vocab], the K of layer 0)."""
    kv = SeqKV.empty(model.cfg, len(ids) + 1, model.kv_dtype, "cpu")
    other = SeqKV.empty(model.cfg, 512, model.kv_dtype, "cpu") if neighbour else None
    rows, at = [], 0
    for size in pieces:
        seg = Segment(kv, ids[at : at + size], logits_from=0)
        segs = [seg] if other is None else [Segment(other, neighbour[at : at + 3]), seg]
        model.forward(segs, deterministic, kernel)
        rows.append(seg.prompt_logits)
        at += size
    return torch.cat(rows), kv.k[0, :, : len(ids)].clone()


@pytest.mark.parametrize("which", ["float32", "int4wo-32"])
def test_model_bits_do_not_depend_on_chunks_or_neighbours(which, engine, request):
    """As the engine runs it (its native kernel passed: float32 weights take its fixed-order matmul)."""
    owner = engine if which == "float32" else request.getfixturevalue("int4_engine")
    model, kernel = owner.model, owner.scheduler.decode_kernel
    assert kernel is not None
    ids = engine.tokenize(chat(engine, "You are terse.", "Explain what a prefix cache does, step by step."))
    ids = (ids * 8)[:150]
    assert len(ids) == 150
    whole, k_whole = _logits(model, ids, [150], True, kernel=kernel)
    for pieces, neighbour in (
        ([70, 1, 1, 78], None),
        ([1] * 5 + [145], None),
        ([64, 64, 22], list(range(900, 1400))),
        ([100, 1, 49], None),  # MKL on an Intel Xeon: 64-160 rows with K = 1536 differ from others
    ):
        logits, k = _logits(model, ids, pieces, True, neighbour, kernel)
        assert torch.equal(logits, whole), pieces
        assert torch.equal(k, k_whole), pieces


@pytest.mark.parametrize("kv_cache_dtype", ["bfloat16", "int8"])
def test_int4wo_cold_cached_and_batched_decodes_are_identical(int4_engine, document, kv_cache_dtype):
    """The bench's case (a long document, int4 weights, bf16 activations), 40 greedy tokens:
    without the flag the cold and cached decodes diverged for every KV dtype (bench_kv)."""
    det = int4_engine.sibling(kv_cache_dtype=kv_cache_dtype, enable_deterministic_inference=True)
    cold = int4_engine.sibling(
        kv_cache_dtype=kv_cache_dtype, enable_deterministic_inference=True, disable_radix_cache=True
    )
    params = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}
    prompts = [chat(det, document, q) for q in ("What is this essay about?", "Who is mentioned first?")]
    try:
        first = det.generate(prompts[0], sampling_params=params)
        again = det.generate(prompts[0], sampling_params=params)  # all but its last token cached
        second = det.generate(prompts[1], sampling_params=params)  # the document cached
        batched = cold.generate(prompts, sampling_params=params)  # both together, nothing cached
    finally:
        det.shutdown()
        cold.shutdown()
    assert again["meta_info"]["cached_tokens"] == len(det.tokenize(prompts[0])) - 1
    assert second["meta_info"]["cached_tokens"] > 1400
    assert again["output_ids"] == first["output_ids"] == batched[0]["output_ids"]
    assert second["output_ids"] == batched[1]["output_ids"]


def test_the_flag_reaches_the_engine_and_the_server_info(engine):
    ns = build_parser().parse_args(["--enable-deterministic-inference"])
    assert engine_config(ns)["enable_deterministic_inference"] is True
    assert engine_config(build_parser().parse_args([]))["enable_deterministic_inference"] is False
    sibling = engine.sibling(enable_deterministic_inference=True, max_total_tokens=1024)
    try:
        assert sibling.scheduler.deterministic and not engine.scheduler.deterministic
        assert sibling.pool.planes[0].shape[2] == 1024 + BLOCK  # rows past the last slot: zeros
        assert sibling.get_cache_stats()["pool_capacity_bytes"] == 1024 * sibling.kv_bytes_per_token
    finally:
        sibling.shutdown()


@pytest.mark.parametrize("start_from_end", [None, 3, 40])
def test_deterministic_logprob_requests_use_the_cache_with_the_same_numbers(engine, start_from_end):
    """Deterministic, a logprob request is served from the cache up to logprob_start_len (as in
    SGLang) and still reports the bits of a prefix_cache=False run."""
    det = engine.sibling(enable_deterministic_inference=True, max_total_tokens=2048)
    base = "The quick brown fox jumps over the lazy dog. " * 8
    prompt = base + "Then it ran into the river and swam"
    try:
        det.generate(prompt=base + "Then it ran into the forest", sampling_params={"max_new_tokens": 2})
        n = len(det.tokenize(prompt))
        start = -1 if start_from_end is None else n - start_from_end
        kw = {"return_logprob": True, "logprob_start_len": start, "top_logprobs_num": 5}
        params = {"max_new_tokens": 6, "temperature": 0}
        cached = det.generate(prompt=prompt, sampling_params=params, **kw)["meta_info"]
        cold = det.generate(prompt=prompt, sampling_params=params, prefix_cache=False, **kw)["meta_info"]
    finally:
        det.shutdown()
    shared = len(engine.tokenize(base + "Then it ran into the"))
    assert cached["cached_tokens"] == min(shared, n - 1 if start == -1 else start) > 40
    assert cold["cached_tokens"] == 0
    for key in ("input_token_logprobs", "output_token_logprobs", "input_top_logprobs", "output_top_logprobs"):
        assert cached[key] == cold[key], key


def test_the_flag_is_refused_off_the_cpu():
    from runtime.config import EngineConfig

    with pytest.raises(
        ValueError, match="enable_deterministic_inference is measured for the CPU engine only"
    ):
        EngineConfig(device="cuda", enable_deterministic_inference=True)
