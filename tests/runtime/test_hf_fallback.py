"""An architecture without a compact forward runs through the HF fallback with the same cache."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory, engine):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny-gpt2")
    config = GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=4,
        n_positions=512,
        vocab_size=len(engine.tokenizer),
        eos_token_id=engine.tokenizer.eos_token_id,
        bos_token_id=1,
    )
    GPT2LMHeadModel(config).save_pretrained(folder)
    engine.tokenizer.save_pretrained(folder)
    return folder


def test_fallback_reuses_prefix_with_identical_outputs(tiny_gpt2):
    from runtime import Engine

    with Engine(model_path=str(tiny_gpt2), max_total_tokens=1024) as eng:
        assert eng.model_info["architecture"] == "gpt2"
        ids = list(range(500, 620))
        sp = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
        cold = eng.generate(input_ids=ids, sampling_params=sp, prefix_cache=False)
        eng.generate(input_ids=ids[:100] + [7, 8, 9], sampling_params=sp)
        warm = eng.generate(input_ids=ids, sampling_params=sp)
        assert warm["meta_info"]["cached_tokens"] == 100
        assert warm["output_ids"] == cold["output_ids"]
        eng.check_integrity()


def test_fallback_refuses_deterministic_inference(tiny_gpt2):
    """transformers' attention is not batch-invariant: the flag is refused, not ignored."""
    from runtime import Engine

    with pytest.raises(ValueError, match="enable_deterministic_inference needs the compact forward"):
        Engine(model_path=str(tiny_gpt2), max_total_tokens=1024, enable_deterministic_inference=True)
