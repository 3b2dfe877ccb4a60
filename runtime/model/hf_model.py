"""Fallback for architectures the compact forward does not cover: the HF transformers model
itself, fed each request's K/V from its SeqKV (pool slots) through a DynamicCache.

Slower than `LlamaModel` (one HF call per request per step, K/V copied in and out), but it
keeps the engine, the radix cache and every API identical for any decoder-only model whose
cache layers are plain [batch, kv_heads, seq, head_dim] tensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch

from runtime.model.model import ModelConfig, Segment

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def generic_config(c: Any) -> ModelConfig:
    text = c.get_text_config(decoder=True) if hasattr(c, "get_text_config") else c
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return ModelConfig(
        arch=text.model_type,
        vocab_size=text.vocab_size,
        hidden=text.hidden_size,
        layers=text.num_hidden_layers,
        heads=heads,
        kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        intermediate=getattr(text, "intermediate_size", 0) or 0,
        rope_theta=0.0,
        eps=0.0,
        max_positions=getattr(text, "max_position_embeddings", 2048),
        tie_embeddings=bool(getattr(text, "tie_word_embeddings", False)),
    )


class HFModel:
    def __init__(self, hf_model: PreTrainedModel, dtype: torch.dtype, device: str) -> None:
        module: torch.nn.Module = (
            hf_model  # typed as a module: transformers' wrapper of `to` hides its signature
        )
        self.hf = module.to(device=device, dtype=dtype).eval()
        self.cfg = generic_config(hf_model.config)
        self.dtype, self.device = dtype, device
        self.kv_dtype = dtype

    def exact(self, deterministic: bool, kernel: object) -> bool:
        """Never: transformers' kernels pick their blocking from each call's shapes."""
        return False

    @torch.inference_mode()
    def forward(
        self, segments: list[Segment], deterministic: bool = False, decode_kernel: object = None
    ) -> torch.Tensor:
        """Same contract as LlamaModel.forward: last-token logits [S, vocab], K/V appended.
        Never deterministic nor with a decode kernel: engine_build gives this fallback neither."""
        return torch.cat([self._one(s) for s in segments])

    def _one(self, seg: Segment) -> torch.Tensor:
        from transformers import DynamicCache

        m, n, kv = seg.kv.length, len(seg.ids), seg.kv
        cache = (
            DynamicCache(ddp_cache_data=[kv.layer(i, m) for i in range(self.cfg.layers)])
            if m
            else DynamicCache()
        )
        ids = torch.tensor([seg.ids], device=self.device)
        positions = torch.arange(m, m + n, device=self.device).unsqueeze(0)
        out = self.hf(input_ids=ids, cache=cache, position_ids=positions, use_cache=True)
        # the cache object is extended in place; transformers types its layers as a union that
        # includes linear-attention layers (no keys/values), which our full-attention models never use
        for i, layer in enumerate(cast(list[Any], cache.layers)):
            kv.write(i, m, layer.keys[0, :, m : m + n], layer.values[0, :, m : m + n])
        kv.length += n
        if seg.logits_from >= 0:
            seg.prompt_logits = out.logits[0, seg.logits_from :].float()
        return out.logits[:, -1].float()
