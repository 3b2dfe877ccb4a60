"""How K/V is stored (`--kv-cache-dtype`) and how attention reads it back.

Every buffer that holds K/V (the pool, a request's SeqKV) is a tuple of *planes* laid out as
[layers, kv_heads, positions, x]: a float format has (k, v) with x = head_dim; `int8` adds one
float32 scale per (token, head) for K and for V: (k, v, k_scale, v_scale) with x = 1 for the
scales. Moving a prefix in or out of the pool is one index per plane, whatever the format.

Quantize-on-write is a function of one token's own K/V row (a cast, or that row's absmax
scale), never of its chunk: a token stores the same bytes whether it was computed in a cold
prefill chunk or appended later, which is what keeps cached = uncached within one format.

Attention runs in the compute dtype (float32 on the CPU, where the bf16/fp16 SDPA kernels
measured 4-7x slower). A format stored in another dtype is converted per step and layer into
a scratch buffer of one layer's K/V that stays in cache (evals/benchmarks/kv_attention.py measures
reading the stored format directly against converting).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: accepted `kv_cache_dtype` values; `auto` is the model's dtype (`--dtype`), as in SGLang
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16", "int8")
ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
#: SGLang names we know and refuse, with the reason
REFUSED = {
    "fp8_e4m3": "fp8_e4m3 has no fast float8 conversion on this CPU (measured several times slower than int8's "
    "dequantization); use int8 (8-bit with a scale per token and head) for quarter-size KV",
    "fp8_e5m2": "fp8_e5m2 keeps 2 mantissa bits with no scale and converts slower than int8 on this CPU; use int8 "
    "(8-bit with a scale per token and head) for quarter-size KV",
    "fp4_e2m1": "fp4_e2m1 is not implemented; the smallest KV format here is int8",
}
_FLOATS = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_TINY = torch.finfo(torch.float32).tiny  # the scale of an all-zero row (its levels stay 0)


def canonical(name: str) -> str:
    return ALIASES.get(name, name)


def kv_cache_dtype_problems(name: str) -> list[str]:
    """Why `name` is not a usable kv_cache_dtype (empty: it is)."""
    name = canonical(name)
    if name in KV_CACHE_DTYPES:
        return []
    if name in REFUSED:
        return [f"kv_cache_dtype {REFUSED[name]}"]
    return [f"kv_cache_dtype must be one of {KV_CACHE_DTYPES} (aliases {sorted(ALIASES)}), got {name!r}"]


@dataclass(frozen=True, slots=True)
class KVFormat:
    """One storage format. `storage`: the element type of the K/V planes; `compute`: what
    attention runs in; `scaled`: int8 levels with a float32 absmax scale per (token, head)."""

    name: str
    storage: torch.dtype
    compute: torch.dtype
    scaled: bool = False

    @classmethod
    def resolve(cls, name: str, model_dtype: torch.dtype, compute: torch.dtype) -> KVFormat:
        """`auto` stores the model's dtype. Raises ValueError for an unknown or refused name."""
        problems = kv_cache_dtype_problems(name)
        if problems:
            raise ValueError(problems[0])
        name = canonical(name)
        if name == "auto":
            name = next(k for k, v in _FLOATS.items() if v == model_dtype)
        if name == "int8":
            return cls("int8", torch.int8, compute, scaled=True)
        return cls(name, _FLOATS[name], compute)

    @classmethod
    def plain(cls, dtype: torch.dtype) -> KVFormat:
        """Stored and computed in one float dtype (the format before kv_cache_dtype existed)."""
        return cls(next(k for k, v in _FLOATS.items() if v == dtype), dtype, dtype)

    @property
    def converts(self) -> bool:
        """Attention reads through a scratch copy in the compute dtype (else: the buffer itself)."""
        return self.storage != self.compute

    def bytes_per_token(self, layers: int, kv_heads: int, head_dim: int) -> int:
        per_head = head_dim * torch.empty(0, dtype=self.storage).element_size() + (4 if self.scaled else 0)
        return 2 * layers * kv_heads * per_head

    def alloc(
        self, layers: int, kv_heads: int, size: int, head_dim: int, device: str, zeros: bool = False
    ) -> tuple[torch.Tensor, ...]:
        make = torch.zeros if zeros else torch.empty
        data = tuple(
            make((layers, kv_heads, size, head_dim), dtype=self.storage, device=device) for _ in "kv"
        )
        if not self.scaled:
            return data
        return data + tuple(
            make((layers, kv_heads, size, 1), dtype=torch.float32, device=device) for _ in "kv"
        )

    def store(self, dst: tuple[torch.Tensor, ...], k: torch.Tensor, v: torch.Tensor) -> None:
        """Writes new tokens' K and V ([kv_heads, n, head_dim] each) into one layer's planes
        (views [kv_heads, n, x] of the positions they take)."""
        if not self.scaled:
            dst[0].copy_(k)
            dst[1].copy_(v)
            return
        _quantize(k, dst[0], dst[2])
        _quantize(v, dst[1], dst[3])

    def store_at(
        self, planes: tuple[torch.Tensor, ...], rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """`store` into scattered rows of one layer's planes ([kv_heads, size, x]): the same bytes
        per token (a cast, or that row's own scale), written with one index_copy_ per plane."""
        if not self.scaled:
            planes[0].index_copy_(1, rows, k.to(self.storage))
            planes[1].index_copy_(1, rows, v.to(self.storage))
            return
        for x, levels, scales in ((k, planes[0], planes[2]), (v, planes[1], planes[3])):
            q = torch.empty(x.shape, dtype=torch.int8, device=x.device)
            sc = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)
            _quantize(x, q, sc)
            levels.index_copy_(1, rows, q)
            scales.index_copy_(1, rows, sc)

    def load(self, src: tuple[torch.Tensor, ...], k_out: torch.Tensor, v_out: torch.Tensor) -> None:
        """Converts one layer's stored positions ([kv_heads, m, x] planes) into k_out / v_out."""
        k_out.copy_(src[0])
        v_out.copy_(src[1])
        if self.scaled:
            k_out.mul_(src[2])
            v_out.mul_(src[3])


def _quantize(x: torch.Tensor, levels: torch.Tensor, scale: torch.Tensor) -> None:
    """Symmetric int8 per row of x ([..., head_dim]): scale = absmax / 127, levels = round(x / scale).
    Each row depends on itself only; |x / scale| <= 127 up to rounding, so no clamp is needed."""
    x = x.float()
    torch.div(torch.linalg.vector_norm(x, float("inf"), dim=-1, keepdim=True), 127.0, out=scale)
    scale.clamp_min_(_TINY)
    levels.copy_(torch.div(x, scale).round_())
