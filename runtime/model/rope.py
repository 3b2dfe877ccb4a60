"""Rotary position tables for the compact forward: plain RoPE, Llama 3's frequency scaling
(`rope_type: llama3`), linear position interpolation (`rope_type: linear`), and per-frequency
divisors as a GGUF carries them (`rope_freqs`, llama.cpp's form of the Llama 3 scaling).

The arithmetic follows transformers' `modeling_rope_utils` step for step (the same float32
ops in the same order), so the tables are the bits HF's rotary embedding computes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

#: rope types the compact forward computes exactly; others run on the HF fallback
ROPE_TYPES = ("default", "llama3", "linear")


@dataclass(frozen=True, slots=True)
class Rope:
    """How positions become angles. `factor`, `low_freq_factor`, `high_freq_factor` and
    `original_max_positions` are Llama 3's parameters (`factor` alone: linear scaling)."""

    theta: float
    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = 8192

    def __post_init__(self) -> None:
        if self.kind not in ROPE_TYPES:
            raise ValueError(f"rope type {self.kind!r} is not one of {ROPE_TYPES}")
        if self.theta <= 0 or self.factor <= 0:
            raise ValueError(f"rope: theta {self.theta} and factor {self.factor} must be positive")
        if self.kind == "llama3" and self.high_freq_factor <= self.low_freq_factor:
            raise ValueError("rope llama3: high_freq_factor must exceed low_freq_factor")

    @classmethod
    def from_hf(cls, params: dict, default_theta: float) -> Rope:
        """From a transformers config's `rope_parameters` (5.x) / `rope_scaling` (older) dict."""
        kind = params.get("rope_type", params.get("type", "default")) or "default"
        theta = float(params.get("rope_theta", default_theta))
        if kind == "default":
            return cls(theta)
        if kind not in ROPE_TYPES:
            raise ValueError(f"rope scaling {kind!r} is not supported by the compact forward")
        if kind == "linear":
            return cls(theta, kind, float(params["factor"]))
        return cls(
            theta,
            kind,
            float(params["factor"]),
            float(params["low_freq_factor"]),
            float(params["high_freq_factor"]),
            int(params["original_max_position_embeddings"]),
        )

    def inv_freq(self, head_dim: int) -> torch.Tensor:
        """[head_dim / 2] float32, as transformers' rope init functions compute it."""
        exps = torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype=torch.float) / head_dim
        inv = 1.0 / (self.theta**exps)
        if self.kind == "linear":
            return inv / self.factor
        if self.kind == "llama3":
            return self._llama3(inv)
        return inv

    def _llama3(self, inv: torch.Tensor) -> torch.Tensor:
        old = self.original_max_positions
        low_wavelen, high_wavelen = old / self.low_freq_factor, old / self.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / self.factor, inv)
        smooth = (old / wavelen - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
        smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)


def tables(
    rope: Rope,
    head_dim: int,
    positions: int,
    device: str,
    dtype: torch.dtype,
    divisors: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, [positions, head_dim] each in HF's rotate_half layout. `divisors`
    ([head_dim / 2], a GGUF's `rope_freqs`): each frequency divided by its factor, as llama.cpp
    applies Llama 3's scaling."""
    inv = rope.inv_freq(head_dim)
    if divisors is not None:
        if divisors.shape != inv.shape:
            raise ValueError(f"rope_freqs has {tuple(divisors.shape)} factors for {inv.shape[0]} frequencies")
        inv = inv / divisors.float()
    angles = torch.outer(torch.arange(positions, dtype=torch.float32), inv)
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos().to(device, dtype), emb.sin().to(device, dtype)
