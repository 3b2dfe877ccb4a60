"""The compact forward against the HF reference, and the weight-only quantized (torchao_config) paths."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from evals.benchmarks.bench_gpu import IdTokenizer
from runtime import Engine
from runtime.cache.seq_kv import SeqKV
from runtime.config import EngineConfig
from runtime.model.model import LlamaModel, ModelConfig, Segment
from runtime.model.quant import Int4, Int8, QuantizationError
from tests.runtime.conftest import GREEDY, chat

TINY = ModelConfig(
    "llama",
    vocab_size=256,
    hidden=64,
    layers=2,
    heads=4,
    kv_heads=2,
    head_dim=16,
    intermediate=128,
    rope_theta=10000.0,
    eps=1e-5,
    max_positions=512,
    tie_embeddings=True,
)


def test_compact_forward_matches_hf_greedy_token_for_token(engine, loaded):
    for question in ("What is the capital of France?", "Write a haiku about the sea."):
        prompt = chat(engine, "You are a helpful assistant.", question)
        ids = engine.tokenize(prompt)
        ours = engine.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 24})
        ref = loaded.hf_model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=24)[0, len(ids) :]
        assert ours["output_ids"] == ref.tolist()[: len(ours["output_ids"])], question


def test_compact_forward_logits_close_to_hf(engine, loaded):
    ids = engine.tokenize(chat(engine, "Be brief.", "Name three colours."))
    kv = SeqKV.empty(engine.model.cfg, len(ids), engine.model.kv_dtype, "cpu")
    ours = engine.model.forward([Segment(kv, ids)])[0]
    with torch.inference_mode():
        ref = loaded.hf_model(torch.tensor([ids])).logits[0, -1]
    assert (ours - ref).abs().max().item() < 1e-3


def test_int4wo_streams_a_sixth_of_the_weights_and_answers(int4_engine, engine):
    assert int4_engine.model.weight_bytes < engine.model.weight_bytes / 5
    assert int4_engine.model_info["torchao_config"] == "int4wo-32"
    out = int4_engine.generate(
        chat(int4_engine, "Answer in one word.", "What is the capital of France?"), sampling_params=GREEDY
    )
    assert "Paris" in out["text"]


def test_int4wo_cached_equals_uncached_and_batched_equals_alone(int4_engine, document):
    uncached = int4_engine.sibling(disable_radix_cache=True)
    prompts = [
        chat(int4_engine, document, q) for q in ("What is this essay about?", "Who is mentioned first?")
    ]
    try:
        first = [int4_engine.generate(p, sampling_params=GREEDY) for p in prompts]
        again = int4_engine.generate(prompts[0], sampling_params=GREEDY)
        batched = uncached.generate(prompts, sampling_params=GREEDY)
    finally:
        uncached.shutdown()
    assert again["meta_info"]["cached_tokens"] == len(int4_engine.tokenize(prompts[0])) - 1
    assert first[1]["meta_info"]["cached_tokens"] > 1400  # the document, computed by the first question
    # first[0] ran alone and cold, first[1] on the cached document; both ran batched and uncached too
    for alone, together in zip(first, batched, strict=True):
        assert alone["output_ids"] == together["output_ids"]
    assert again["output_ids"] == first[0]["output_ids"]


@pytest.mark.parametrize("prefix,new", [(0, 7), (0, 300), (0, 1024), (37, 5), (1024, 1022)])
def test_attention_mask_variants_are_bit_identical(prefix, new):
    """The forward uses SDPA's is_causal when a chunk has no prefix and an additive mask built
    once per step when it has one (both faster); each must equal the plain boolean mask bit for
    bit, or a token's K/V would depend on which variant its chunk took."""
    from runtime.model.model import _Views

    g = torch.Generator().manual_seed(prefix + new)
    kv = SeqKV(
        torch.randn(1, 3, prefix + new, 64, generator=g),
        torch.randn(1, 3, prefix + new, 64, generator=g),
        list(range(prefix + new)),
        length=prefix,
    )
    q = torch.randn(1, 9, new, 64, generator=g)
    seen = torch.arange(prefix + new)[None, :] <= (prefix + torch.arange(new))[:, None]
    reference = F.scaled_dot_product_attention(
        q, kv.k[0].unsqueeze(0), kv.v[0].unsqueeze(0), attn_mask=seen, enable_gqa=True
    )
    views = _Views.of(kv, new, "cpu", torch.float32, deterministic=False, kernel=None, heads=9)
    assert views.causal == (prefix == 0) and (views.mask is None) == (prefix == 0)
    out = F.scaled_dot_product_attention(
        q, views.k[0], views.v[0], attn_mask=views.mask, is_causal=views.causal, enable_gqa=True
    )
    assert torch.equal(out, reference)


def test_int4_quantize_recovers_a_q4_1_grid():
    g = torch.Generator().manual_seed(0)
    n, k, group = 64, 128, 32
    d = torch.rand(n, k // group, 1, generator=g) * 0.01 + 0.001
    m = -8 * d + torch.randn(n, k // group, 1, generator=g) * 1e-3
    levels = torch.randint(0, 16, (n, k // group, group), generator=g)
    levels[..., 0], levels[..., 1] = 0, 15  # ggml's Q4_1 maps each block's min and max to 0 and 15
    w = (d * levels + m).reshape(n, k)
    layer = Int4.quantize(w, group, torch.bfloat16, None)
    dequant = layer(torch.eye(k, dtype=torch.bfloat16)).float().t()
    # the kernel returns bf16 (rounding |w| * 2^-8); beyond that, far below one quantization step d
    excess = (dequant - w).abs() - w.abs() * 2**-8
    assert (excess.reshape(n, k // group, group) / d).max().item() < 0.05


def test_int8_rows_match_its_matmul():
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(1))
    layer = Int8.quantize(w, torch.bfloat16, None)
    ids = torch.tensor([3, 7])
    assert torch.allclose(layer.rows(ids).float(), w[ids], atol=w.abs().max().item() / 100)
    assert torch.allclose(
        layer(torch.eye(64, dtype=torch.bfloat16)).float().t()[ids], layer.rows(ids).float(), atol=1e-2
    )


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (dict(torchao_config="int4wo-32", dtype="float32"), "bfloat16"),
        (dict(torchao_config="int4wo-32", device="cuda"), "CPU engine only"),
        (dict(torchao_config="int3"), "must be one of"),
    ],
)
def test_bad_torchao_config_is_a_clear_error(config, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**config)


def test_torchao_config_defaults_to_bfloat16_activations():
    assert EngineConfig(torchao_config="int8wo").dtype == "bfloat16"


def test_the_default_is_int4wo_32_on_the_cpu_and_a_dtype_alone_means_dense_weights():
    default = EngineConfig()
    assert (default.dtype, default.torchao_config, default.default_weights) == ("bfloat16", "int4wo-32", True)
    for dtype in ("float32", "bfloat16"):
        dense = EngineConfig(dtype=dtype)
        assert (dense.dtype, dense.torchao_config, dense.default_weights) == (dtype, None, False)
    gpu = EngineConfig(device="cuda")
    assert (gpu.dtype, gpu.torchao_config) == ("float32", None)
    chosen = EngineConfig(torchao_config="int4wo-64")
    assert (chosen.dtype, chosen.torchao_config, chosen.default_weights) == ("bfloat16", "int4wo-64", False)


def test_group_that_does_not_divide_the_layer_is_refused():
    with pytest.raises(QuantizationError, match="divisible by 128"):
        LlamaModel.random(TINY, torch.bfloat16, "cpu", torchao_config="int4wo-128")


@pytest.mark.parametrize("torchao_config", ["int4wo-32", "int8wo"])
def test_quantized_tiny_model_cached_equals_uncached(torchao_config):
    model = LlamaModel.random(TINY, torch.bfloat16, "cpu", torchao_config=torchao_config)
    eng = Engine.from_model(model, IdTokenizer(), "tiny", max_total_tokens=2048)
    cold = eng.sibling(disable_radix_cache=True)
    try:
        head = list(range(5, 200))
        params = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
        eng.generate(input_ids=head + [1, 2], sampling_params=params)
        warm = eng.generate(input_ids=head + [3, 4], sampling_params=params)
        ref = cold.generate(input_ids=head + [3, 4], sampling_params=params)
    finally:
        cold.shutdown()
        eng.shutdown()
    assert warm["meta_info"]["cached_tokens"] == len(head)
    assert warm["output_ids"] == ref["output_ids"]
