"""What the compact forward needs to know of a model, read from a transformers config.

Families: Llama (Llama 2/3.x, SmolLM2), Mistral, Qwen2 and Qwen3. Qwen3 adds a per-head RMSNorm
on q and k before the rope (`qk_norm`) and sets head_dim apart from hidden/heads; Llama 3.x
scales its rope frequencies (`rope_type: llama3`). A config outside what this forward computes
exactly raises `UnsupportedModel`, and the engine runs the HF fallback instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runtime.model.rope import Rope

SUPPORTED = ("llama", "qwen2", "mistral", "qwen3")
#: families whose attention normalises each q and k head (q_norm / k_norm) before the rope
QK_NORM = frozenset({"qwen3"})


class UnsupportedModel(ValueError):
    """A config the compact forward cannot run exactly (the message says which setting)."""


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
    qk_norm: bool = False
    #: the rope as computed; None: plain RoPE with `rope_theta`
    rope: Rope | None = field(default=None)

    def __post_init__(self) -> None:
        if self.heads % self.kv_heads:
            raise UnsupportedModel(f"{self.heads} query heads are not a multiple of {self.kv_heads} KV heads")

    @property
    def rotary(self) -> Rope:
        return self.rope or Rope(self.rope_theta)

    @classmethod
    def from_hf(cls, c: Any) -> ModelConfig:
        if c.model_type not in SUPPORTED:
            raise UnsupportedModel(f"architecture {c.model_type!r} is not supported (supported: {SUPPORTED})")
        theta = float(getattr(c, "rope_theta", None) or 10000.0)
        params = dict(getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {})
        if float(params.get("partial_rotary_factor", getattr(c, "partial_rotary_factor", 1.0)) or 1.0) != 1.0:
            raise UnsupportedModel("partial_rotary_factor != 1 is not supported by the compact forward")
        try:
            rope = Rope.from_hf(params, theta)
        except (KeyError, ValueError) as e:
            raise UnsupportedModel(f"rope scaling: {e}") from e
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return cls(
            c.model_type,
            c.vocab_size,
            c.hidden_size,
            c.num_hidden_layers,
            c.num_attention_heads,
            c.num_key_value_heads or c.num_attention_heads,
            head_dim,
            c.intermediate_size,
            rope.theta,
            float(c.rms_norm_eps),
            _positions(c),
            bool(getattr(c, "tie_word_embeddings", False)),
            c.model_type in QK_NORM,
            rope,
        )

    @property
    def params(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        per_layer = self.hidden * (2 * q + 2 * kv) + 3 * self.hidden * self.intermediate + 2 * self.hidden
        head = 0 if self.tie_embeddings else self.vocab_size * self.hidden
        return self.layers * per_layer + self.vocab_size * self.hidden + head + self.hidden


def _positions(c: Any) -> int:
    """The context the compact forward serves: max_position_embeddings, capped at the sliding
    window where any layer slides (within the window, sliding and full attention are the same)."""
    positions = int(c.max_position_embeddings)
    window = getattr(c, "sliding_window", None)
    types = getattr(c, "layer_types", None)
    if types is not None:
        slides = "sliding_attention" in types
    else:
        slides = bool(getattr(c, "use_sliding_window", c.model_type == "mistral"))
    if slides and window:
        return min(positions, int(window))
    return positions
