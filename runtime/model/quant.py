"""Weight-only quantization for the compact forward (SGLang's `--torchao-config` names).

Decode on a CPU is bound by reading the weights once per token: fp32 SmolLM2-135M streams 540 MB
per step. `int4wo-G` keeps each linear layer as 4-bit levels with one bf16 scale and zero per
group of G input columns (the layout of the GGUF's own Q4_1 blocks when G=32, so the levels the
bundled file shipped come back exactly) with bf16 activations: in the native kernel's tiles
(`Int4Tiles`, runtime/model/csrc/int4_linear.c: bf16 pair dot products, up to 2.1x torch's
int4 matmul) wherever it is built (AVX512-BF16), else torch's packed int4 matmul (`Int4`);
`int8wo` keeps one int8 row per output with a per-row scale.

Every kernel here computes each output row from its own input row only, so a token's result does
not depend on how many tokens share the step: cached and uncached runs stay identical.
The embedding lookup and the lm_head (Q8_0 in the GGUF) use int8 rows in both modes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from runtime.config import torchao_problems
from runtime.model.decode_kernel import DecodeKernel


class QuantizationError(ValueError):
    """A quantization setting this model, device or dtype cannot run."""


@dataclass(frozen=True, slots=True)
class Dense:
    weight: torch.Tensor
    bias: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes


def int4_levels(w: torch.Tensor, group: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """4-bit levels q [n, k] (int32, 0..15) and per-group scale and zero [n, k / group] in `dtype`:
    w ~ (q - 8) * scale + zero, the GGUF Q4_1 blocks' own form when group = 32."""
    n, k = w.shape
    if k % group:
        raise QuantizationError(f"int4wo-{group} needs input sizes divisible by {group}; a layer has {k}")
    if n % 16:  # both int4 kernels store outputs in tiles of 16
        raise QuantizationError(f"int4wo-{group} needs output sizes divisible by 16; a layer has {n}")
    g = w.float().reshape(n, k // group, group)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = ((hi - lo) / 15).clamp_min(1e-12).to(dtype)
    zero = (lo + 8 * scale.float()).to(dtype)
    # Levels are chosen against the rounded scale and zero, so rounding them costs nothing extra.
    q = torch.round((g - zero.float()[..., None]) / scale.float()[..., None] + 8).clamp(0, 15)
    return q.reshape(n, k).to(torch.int32), scale, zero


@dataclass(frozen=True, slots=True)
class Int4:
    """torch's packed int4 matmul: where the native one (`Int4Tiles`) is not built."""

    packed: torch.Tensor
    scales_zeros: torch.Tensor  # [K / group, N, 2]: dequantized w = (q - 8) * scale + zero
    group: int
    bias: torch.Tensor | None = None

    @classmethod
    def quantize(cls, w: torch.Tensor, group: int, dtype: torch.dtype, bias: torch.Tensor | None) -> Int4:
        q, scale, zero = int4_levels(w, group, dtype)
        packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
        sz = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous()
        return cls(packed, sz, group, None if bias is None else bias.to(dtype))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = torch._weight_int4pack_mm_for_cpu(x, self.packed, self.group, self.scales_zeros)
        return out if self.bias is None else out + self.bias

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales_zeros.nbytes


#: tiles per panel: csrc/int4_linear.c's PANEL
PANEL = 4


@dataclass(frozen=True, slots=True)
class Int4Tiles:
    """The same levels in the native kernel's tiles (runtime/model/csrc/int4_linear.c): bf16 pair
    dot products, scale and zero once per group; on AVX512-BF16 CPUs 1.1x torch's int4 matmul
    for one row, 1.5-2.1x for 4 rows to prompt chunks; each row the same bits whatever rows share
    the call."""

    tiles: torch.Tensor  # uint8 [N * K / 2]: panels of PANEL tiles of 16 outputs, 32 bytes per 4 inputs
    scales_zeros: torch.Tensor  # bf16 [N / 16, K / group, 2, 16]
    group: int
    kernel: DecodeKernel
    bias: torch.Tensor | None = None

    @staticmethod
    def takes(group: int, kernel: DecodeKernel | None) -> bool:
        return kernel is not None and kernel.int4_fn is not None and group % 4 == 0

    @classmethod
    def quantize(
        cls, w: torch.Tensor, group: int, dtype: torch.dtype, bias: torch.Tensor | None, kernel: DecodeKernel
    ) -> Int4Tiles:
        q, scale, zero = int4_levels(w, group, dtype)
        n, k = q.shape
        # per tile of 16 outputs and 4 inputs, 32 bytes: byte 2i+d = q[i][k+d] | q[i][k+2+d] << 4
        q5 = q.to(torch.uint8).view(n // 16, 16, k // 4, 2, 2)
        quads = (q5[:, :, :, 0] | (q5[:, :, :, 1] << 4)).permute(0, 2, 1, 3).reshape(n // 16, k // 4, 32)
        # panels of PANEL tiles, interleaved per 4 inputs: one stream of bytes per panel
        panels = [quads[p : p + PANEL].transpose(0, 1).reshape(-1) for p in range(0, n // 16, PANEL)]
        per_tile = [t.view(n // 16, 16, -1).permute(0, 2, 1) for t in (scale, zero)]
        sz = torch.stack(per_tile, dim=2).to(torch.bfloat16).contiguous()
        return cls(torch.cat(panels), sz, group, kernel, None if bias is None else bias.to(dtype))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.kernel.int4_linear(x.to(torch.bfloat16), self.tiles, self.scales_zeros, self.group)
        return out if self.bias is None else out + self.bias

    @property
    def nbytes(self) -> int:
        return self.tiles.nbytes + self.scales_zeros.nbytes


@dataclass(frozen=True, slots=True)
class Int8:
    weight: torch.Tensor  # int8 [N, K]
    scales: torch.Tensor  # [N]
    #: the same scales in float32, for the native decode kernel (runtime/model/decode_kernel.py)
    scales32: torch.Tensor
    bias: torch.Tensor | None = None

    @classmethod
    def quantize(cls, w: torch.Tensor, dtype: torch.dtype, bias: torch.Tensor | None) -> Int8:
        scale = (w.float().abs().amax(-1) / 127).clamp_min(1e-12).to(dtype)
        q = torch.round(w.float() / scale.float()[:, None]).clamp(-127, 127).to(torch.int8)
        return cls(
            q.contiguous(), scale, scale.float().contiguous(), None if bias is None else bias.to(dtype)
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = torch._weight_int8pack_mm(x, self.weight, self.scales)
        return out if self.bias is None else out + self.bias

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Dequantized rows: the embedding lookup shares the lm_head's int8 table (tied weights)."""
        return self.weight[ids].to(self.scales.dtype) * self.scales[ids, None]

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes + self.scales.nbytes


Linear = Dense | Int4 | Int4Tiles | Int8


@dataclass(frozen=True, slots=True)
class WeightFormat:
    """How the compact forward stores its linear layers: dense in `dtype`, or one torchao config."""

    dtype: torch.dtype
    device: str
    torchao_config: str | None = None
    #: the native kernels: int4 layers in its tiles where it has the int4 matmul
    kernel: DecodeKernel | None = None

    def __post_init__(self) -> None:
        if self.torchao_config is not None:
            dtype = str(self.dtype).removeprefix("torch.")
            problems = torchao_problems(self.torchao_config, self.device, dtype)
            if problems:
                raise QuantizationError(problems[0])

    def linear(self, w: torch.Tensor, bias: torch.Tensor | None = None) -> Linear:
        cfg = self.torchao_config
        if cfg is None:
            return Dense(self._dense(w), None if bias is None else self._dense(bias))
        if cfg == "int8wo":
            return Int8.quantize(w, self.dtype, bias)
        group = int(cfg.split("-")[1])
        if self.kernel is not None and Int4Tiles.takes(group, self.kernel):
            return Int4Tiles.quantize(w, group, self.dtype, bias, self.kernel)
        return Int4.quantize(w, group, self.dtype, bias)

    def head(self, w: torch.Tensor) -> Dense | Int8:
        """The lm_head (and, when tied, the embedding table): int8 rows whenever quantized."""
        return Dense(self._dense(w)) if self.torchao_config is None else Int8.quantize(w, self.dtype, None)

    def _dense(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(device=self.device, dtype=self.dtype).contiguous()
