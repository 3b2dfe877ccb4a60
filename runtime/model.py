"""A compact forward pass for llama-family models (Llama, SmolLM2, Qwen2, Mistral).

Per-step overhead, not arithmetic, limits a 135M model on a CPU, so each layer is a handful
of fused matmuls. Linear layers run over all tokens of a step at once (every request in
the batch); attention runs per request over that request's own contiguous KV buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

SUPPORTED = ("llama", "qwen2", "mistral")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    arch: str
    vocab_size: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    rope_theta: float
    eps: float
    max_positions: int
    tie_embeddings: bool

    @classmethod
    def from_hf(cls, c) -> ModelConfig:
        if c.model_type not in SUPPORTED:
            raise ValueError(f"architecture {c.model_type!r} is not supported (supported: {SUPPORTED})")
        rope = getattr(c, "rope_parameters", None) or {}
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"rope scaling {rope.get('rope_type')!r} is not supported")
        theta = rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return cls(c.model_type, c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_attention_heads,
                   c.num_key_value_heads, head_dim, c.intermediate_size, float(theta), float(c.rms_norm_eps),
                   c.max_position_embeddings, bool(getattr(c, "tie_word_embeddings", False)))

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim  # times the element size


@dataclass(slots=True)
class SeqKV:
    """One request's contiguous K/V: k: [layers, kv_heads, capacity, head_dim]; `length` filled."""

    k: torch.Tensor
    v: torch.Tensor
    length: int = 0

    @classmethod
    def empty(cls, cfg: ModelConfig, capacity: int, dtype: torch.dtype, device: str) -> SeqKV:
        shape = (cfg.layers, cfg.kv_heads, capacity, cfg.head_dim)
        return cls(torch.empty(shape, dtype=dtype, device=device), torch.empty(shape, dtype=dtype, device=device))

    @property
    def capacity(self) -> int:
        return self.k.shape[2]


@dataclass(slots=True)
class Segment:
    """New tokens of one request in this step: ids [n] at positions kv.length .. kv.length+n-1."""

    kv: SeqKV
    ids: list[int]


class LlamaModel:
    def __init__(self, cfg: ModelConfig, state: dict[str, torch.Tensor], dtype: torch.dtype, device: str) -> None:
        self.cfg, self.dtype, self.device = cfg, dtype, device

        def w(name: str) -> torch.Tensor:
            return state[name].to(device=device, dtype=dtype).contiguous()

        def maybe(name: str) -> torch.Tensor | None:
            return w(name) if name in state else None

        self.embed = w("model.embed_tokens.weight")
        self.lm_head = self.embed if cfg.tie_embeddings or "lm_head.weight" not in state else w("lm_head.weight")
        self.norm = w("model.norm.weight")
        self.layers = []
        for i in range(cfg.layers):
            p = f"model.layers.{i}."
            qkv = torch.cat([w(p + f"self_attn.{x}_proj.weight") for x in "qkv"]).contiguous()
            biases = [maybe(p + f"self_attn.{x}_proj.bias") for x in "qkv"]
            qkv_bias = torch.cat(biases).contiguous() if all(b is not None for b in biases) else None
            gate_up = torch.cat([w(p + "mlp.gate_proj.weight"), w(p + "mlp.up_proj.weight")]).contiguous()
            self.layers.append((w(p + "input_layernorm.weight"), qkv, qkv_bias, w(p + "self_attn.o_proj.weight"),
                                w(p + "post_attention_layernorm.weight"), gate_up, w(p + "mlp.down_proj.weight")))
        inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim)
        angles = torch.outer(torch.arange(cfg.max_positions, dtype=torch.float32), inv_freq)
        emb = torch.cat([angles, angles], dim=-1)  # [pos, head_dim], HF's rotate_half layout
        self.cos, self.sin = emb.cos().to(device, dtype), emb.sin().to(device, dtype)

    @classmethod
    def random(cls, cfg: ModelConfig, dtype: torch.dtype, device: str, seed: int = 0) -> LlamaModel:
        """Seeded random weights of the right shapes (GPU timing where no weights can be brought)."""
        g = torch.Generator().manual_seed(seed)
        q, kv = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        shapes = {"model.embed_tokens.weight": (cfg.vocab_size, cfg.hidden), "model.norm.weight": (cfg.hidden,)}
        for i in range(cfg.layers):
            p = f"model.layers.{i}."
            shapes |= {p + "self_attn.q_proj.weight": (q, cfg.hidden), p + "self_attn.k_proj.weight": (kv, cfg.hidden),
                       p + "self_attn.v_proj.weight": (kv, cfg.hidden), p + "self_attn.o_proj.weight": (cfg.hidden, q),
                       p + "mlp.gate_proj.weight": (cfg.intermediate, cfg.hidden),
                       p + "mlp.up_proj.weight": (cfg.intermediate, cfg.hidden),
                       p + "mlp.down_proj.weight": (cfg.hidden, cfg.intermediate),
                       p + "input_layernorm.weight": (cfg.hidden,), p + "post_attention_layernorm.weight": (cfg.hidden,)}
        state = {k: (torch.ones(s) if len(s) == 1 else torch.randn(s, generator=g) * 0.02) for k, s in shapes.items()}
        return cls(cfg, state, dtype, device)

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.cfg.eps)).to(x.dtype) * weight

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    @torch.inference_mode()
    def forward(self, segments: list[Segment]) -> torch.Tensor:
        """Runs every segment's new tokens; returns logits of each segment's last token: [S, vocab].

        Appends the new tokens' K/V to each segment's SeqKV (length advances).
        """
        cfg = self.cfg
        lens = [len(s.ids) for s in segments]
        ids = torch.tensor([t for s in segments for t in s.ids], device=self.device)
        pos = torch.cat([torch.arange(s.kv.length, s.kv.length + len(s.ids)) for s in segments]).to(self.device)
        cos, sin = self.cos[pos].unsqueeze(1), self.sin[pos].unsqueeze(1)  # [N, 1, hd]
        x = self.embed[ids]  # [N, hidden]
        qd, kd = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        for li, (ln1, qkv_w, qkv_b, o_w, ln2, gu_w, down_w) in enumerate(self.layers):
            h = F.linear(self._rms(x, ln1), qkv_w, qkv_b)  # [N, qd + 2 kd]
            q = self._rope(h[:, :qd].view(-1, cfg.heads, cfg.head_dim), cos, sin)
            k = self._rope(h[:, qd : qd + kd].view(-1, cfg.kv_heads, cfg.head_dim), cos, sin)
            v = h[:, qd + kd :].view(-1, cfg.kv_heads, cfg.head_dim)
            attn = self._attend(li, segments, lens, q, k, v)  # [N, qd]
            x = x + F.linear(attn, o_w)
            gu = F.linear(self._rms(x, ln2), gu_w)
            gate, up = gu.chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, down_w)
        for s, n in zip(segments, lens, strict=True):
            s.kv.length += n
        last = torch.tensor(lens, device=self.device).cumsum(0) - 1
        return F.linear(self._rms(x[last], self.norm), self.lm_head).float()

    def _attend(self, li: int, segments: list[Segment], lens: list[int], q, k, v) -> torch.Tensor:
        outs, start = [], 0
        for s, n in zip(segments, lens, strict=True):
            m = s.kv.length  # tokens already in this request's buffer (prefix)
            s.kv.k[li, :, m : m + n] = k[start : start + n].transpose(0, 1)
            s.kv.v[li, :, m : m + n] = v[start : start + n].transpose(0, 1)
            qs = q[start : start + n].transpose(0, 1).unsqueeze(0)  # [1, H, n, hd]
            ks = s.kv.k[li, :, : m + n].unsqueeze(0)  # [1, KVH, m+n, hd]
            vs = s.kv.v[li, :, : m + n].unsqueeze(0)
            mask = None
            if n > 1:  # query i sees the prefix and new tokens <= i (bottom-right aligned causal)
                mask = torch.arange(m + n, device=self.device)[None, :] <= (m + torch.arange(n, device=self.device))[:, None]
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, enable_gqa=True)
            outs.append(o[0].transpose(0, 1).reshape(n, -1))
            start += n
        return outs[0] if len(outs) == 1 else torch.cat(outs)
