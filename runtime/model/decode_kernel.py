"""Native decode kernels: one token's attention read straight from the stored KV format (with,
in a decode-only step, the layer's rope and K/V store in the same call), and, for quantized
weights, a decode step's int8 lm_head, bf16 RMSNorms and silu(gate)*up.

Why: PyTorch's CPU attention runs in float32 (its bf16/fp16 kernels measured 4-15x slower), so
with bfloat16, float16 or int8 KV every layer's K/V was converted into a float32 scratch before
SDPA: a write and a read of twice the stored bytes per layer and step, most of a decode step at
2k tokens of context. runtime/model/csrc/decode_attention.c reads each stored row once and converts
it in registers (measured in `python -m evals.benchmarks.kv_attention`: the "native" rows). The same
library holds the two other pieces of a quantized model's decode step that PyTorch runs slowly
on this CPU: the 49152x576 int8 lm_head (torch's int8 kernel ~11 GB/s, this one at the memory's
speed; bf16 rows from 3 on take AVX512-BF16 pair dot products, the same bits as the FMAs
that one or two rows take) and RMSNorm on a few bf16 rows (~6 small ops of ~5 us each in torch,
one call here).
Later additions, for the same reason (a 135M model's decode step is ~40 small ops per layer):
`layer_step` (rope, K/V store and attention: torch's exact roundings, ~20 ops fewer per layer),
and `silu_mul` (torch's bits, with torch's own SLEEF exp).

Which of these give torch's bits: the rope, K/V store, silu*up and the conversions around
attention do (tested to the bit); the attention, int8 lm_head and RMSNorm sum in
another order (last-bit differences).

The exact fast path (`LlamaModel.exact`: quantized weights, or the deterministic flag) makes
these kernels the definition of a token's arithmetic rather than a decode-only shortcut:
`prefill_attention` gives each prompt row exactly what a decode step at its position computes
(the same CHUNK-key parts, chunk functions and merge), and the norm and int8 lm_head run for
every row count (each row's sums are the same chains whatever rows share the call). With
torch's int4/int8 matmuls, which are row-invariant, a token's logits and K/V are then the same
bits cold, cached, batched or in any chunk. Measured on an AMD EPYC (2 threads): prefill as fast
as SDPA's (515 vs 490 tok/s at 2k tokens), decode unchanged. Float32 weights under the flag
take one more kernel: `linear_f32`, a float32 matmul whose every output is summed in one fixed
order (MKL's sgemm changes its blocking with the row count). The int4 layers take the library's
own matmul where the CPU has AVX512-BF16 (csrc/int4_linear.c, quant.py's `Int4Tiles`): bf16 pair
dot products with the group's scale and zero applied once per group, each output's sums in one
order for every row count; measured on the model's shapes (AMD EPYC, 2 threads) 1.1x torch's
int4 kernel for one row streaming the weights from memory, 1.5x for 4 rows, 2x for 16 and 2.1x
for prompt chunks (~355 vs ~168 GFLOP/s). With it, an int4 model's decode step runs each layer
as one call (csrc/decode_step.c `decode_layer_int4`: the same kernels back to back from C, ~10
Python calls fewer per layer): decode at 2k tokens 115 -> 137 tok/s here.

How it is built: with the machine's C compiler (`$CC`, else `cc`) for this CPU (-march=native)
on first use, into a cache keyed by the source, the flags and the compiler, so a machine builds
it once (~1 s). It links OpenMP by soname, so in a process that imported torch it runs on
torch's own libgomp and thread pool (two OpenMP runtimes would fight over the cores). No
compiler, or a failed build: `KernelUnavailable`, and the engine keeps PyTorch's attention
(`attention_backend="torch_native"` asks for that outright).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from runtime.cache.kv_format import KVFormat
from runtime.errors import RadixAgentError

#: compiled into one library: attention, norms and the int8 head; the int4 matmul; an int4 model's
#: whole decode layer in one call
SOURCES = tuple(
    Path(__file__).parent / "csrc" / n
    for n in ("decode_attention.c", "int4_linear.c", "decode_step.c", "argmax.c")
)
#: compiled with -ffast-math (vectorised expf, reassociated sums), linked without it: GCC 12 links
#: crtfastmath.o into a -shared -ffast-math library, which at load turns on flush-to-zero for the
#: whole process and would change every other op's results
FLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC")
LINK = ("-shared", "-fopenmp")
#: the C side's dtype codes (enum in decode_attention.c)
CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.int8: 3}
#: activation dtypes `decode_layer` takes (its ACT_ enum)
ACTS = {torch.float32: 0, torch.bfloat16: 1}


class KernelUnavailable(RadixAgentError):
    """The native kernel could not be built or loaded here (the message says why)."""


class _Plan(ctypes.Structure):
    """decode_attention.c's `Plan`, field for field."""

    _fields_ = [
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("ks", ctypes.c_void_p),
        ("vs", ctypes.c_void_p),
        ("rows", ctypes.c_void_p),
        ("start", ctypes.c_int64),
        ("n", ctypes.c_int64),
        ("layer_stride", ctypes.c_int64),
        ("head_stride", ctypes.c_int64),
        ("scale_layer_stride", ctypes.c_int64),
        ("scale_head_stride", ctypes.c_int64),
        ("kv_heads", ctypes.c_int32),
        ("g", ctypes.c_int32),
        ("hd", ctypes.c_int32),
        ("dtype", ctypes.c_int32),
        ("threads", ctypes.c_int32),
        ("scale", ctypes.c_float),
    ]


class _Int4Layer(ctypes.Structure):
    """decode_step.c's `Int4Layer`, field for field: qkv, o, gate_up and down in that order."""

    _fields_ = [
        ("ln1", ctypes.c_void_p),
        ("ln2", ctypes.c_void_p),
        ("w", ctypes.c_void_p * 4),
        ("sz", ctypes.c_void_p * 4),
        ("n", ctypes.c_int64 * 4),
        ("group", ctypes.c_int64),
    ]


@dataclass(frozen=True, slots=True)
class Int4Layer:
    """One int4 layer's weights for `DecodeKernel.int4_layer` (the tensors kept alive here)."""

    struct: _Int4Layer
    keep: tuple[torch.Tensor, ...]
    hidden: int

    @classmethod
    def of(
        cls, ln1: torch.Tensor, ln2: torch.Tensor, parts: list[tuple[torch.Tensor, torch.Tensor]], group: int
    ) -> Int4Layer:
        """parts: (tiles, scales_zeros) of qkv, o, gate_up and down (quant.py's Int4Tiles)."""
        tiles, szs = [t for t, _ in parts], [sz for _, sz in parts]
        struct = _Int4Layer(
            ln1.data_ptr(),
            ln2.data_ptr(),
            (ctypes.c_void_p * 4)(*(t.data_ptr() for t in tiles)),
            (ctypes.c_void_p * 4)(*(sz.data_ptr() for sz in szs)),
            (ctypes.c_int64 * 4)(*(sz.shape[0] * 16 for sz in szs)),
            group,
        )
        return cls(struct, (ln1, ln2, *tiles, *szs), ln1.shape[0])


@dataclass(frozen=True, slots=True)
class DecodePlan:
    """One request's K/V for one decode step, every layer: the C struct, and the tensors its
    pointers point into (kept alive here for the step)."""

    plan: _Plan
    keep: tuple[torch.Tensor, ...]
    heads: int
    head_dim: int


@dataclass(frozen=True, slots=True)
class DecodePlans:
    """Plans of one step's one-token requests, as the C array `decode_layer` takes."""

    array: ctypes.Array  # of pointers to each plan's _Plan
    count: int
    heads: int
    head_dim: int
    keep: tuple[DecodePlan, ...]

    @classmethod
    def of(cls, plans: list[DecodePlan], act: torch.dtype) -> DecodePlans | None:
        """None where `decode_layer` does not take them: no plans, plans of other shapes, or
        activations in a dtype it does not take (float16 models keep the torch ops)."""
        if (
            not plans
            or act not in ACTS
            or len({(p.heads, p.head_dim) for p in plans}) != 1
            or plans[0].head_dim % 2
        ):
            return None
        array = (ctypes.POINTER(_Plan) * len(plans))(*(ctypes.pointer(p.plan) for p in plans))
        return cls(array, len(plans), plans[0].heads, plans[0].head_dim, tuple(plans))


def _bind(fn: ctypes._CFuncPtr, argtypes: list) -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    """A library function with its C signature (every kernel returns an int status)."""
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    return fn


@dataclass(frozen=True, slots=True)
class DecodeKernel:
    fn: ctypes._CFuncPtr  # type: ignore[name-defined]  # ctypes' function type has no public name
    int8_fn: ctypes._CFuncPtr  # type: ignore[name-defined]
    rms_fn: ctypes._CFuncPtr  # type: ignore[name-defined]
    layer_fn: ctypes._CFuncPtr  # type: ignore[name-defined]
    prefill_fn: ctypes._CFuncPtr  # type: ignore[name-defined]
    linear_fn: ctypes._CFuncPtr  # type: ignore[name-defined]
    #: the int4 matmul (csrc/int4_linear.c), None where the CPU has no AVX512-BF16
    int4_fn: ctypes._CFuncPtr | None  # type: ignore[name-defined]
    step_fn: ctypes._CFuncPtr  # type: ignore[name-defined]  # an int4 model's decode layer
    #: silu(gate) * up on bf16 rows with torch's exp, or None where its bits differ from torch's
    #: here (checked at load over every bf16 input) or torch's exp cannot be found
    silu_fn: tuple[ctypes._CFuncPtr, int] | None  # type: ignore[name-defined]  # (kernel, torch's exp)
    #: the int8 head on bf16 rows with bf16 pair dot products, None without AVX512-BF16
    int8_bf16_fn: ctypes._CFuncPtr | None  # type: ignore[name-defined]
    #: each row's argmax of float32 logits, torch.argmax's pick (csrc/argmax.c)
    argmax_fn: ctypes._CFuncPtr  # type: ignore[name-defined]

    @classmethod
    def load(cls, cache_dir: Path | None = None) -> DecodeKernel:
        """Builds (once per machine and source) and loads the kernel. Raises KernelUnavailable."""
        if platform.system() != "Linux":
            raise KernelUnavailable(
                f"the native decode kernel is built for Linux only (this is {platform.system()})"
            )
        path = _build(cache_dir or _cache_dir())
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:
            raise KernelUnavailable(f"could not load {path.name}: {e}") from e
        p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32
        plan = ctypes.POINTER(_Plan)
        matmul = [p, p, p, p, i64, i64, i64, i32]  # x, weights, scales, out, m, n, k, threads
        fn = _bind(lib.decode_attention, [plan, i64, p, p])
        int8 = _bind(lib.int8_linear, matmul)
        rms = _bind(lib.rms_norm_bf16, [p, p, p, i64, i64, ctypes.c_float])
        layer = _bind(lib.decode_layer, [p, i64, i64, i32, p, i64, p, p, p])
        prefill = _bind(lib.prefill_attention, [plan, i64, i64, i64, p, p])
        linear = _bind(lib.linear_f32_invariant, matmul)
        int4 = _bind(lib.int4_linear, [p, p, p, p, i64, i64, i64, i64, i32])
        layer4 = [p, i64, i64, ctypes.POINTER(_Int4Layer), p, i64, i64, ctypes.c_float, p, p, p, i32]
        step = _bind(lib.decode_layer_int4, layer4)
        silu = _bind(lib.silu_mul_bf16, [p, p, i64, i64, p])
        exp16 = _torch_exp16()
        bound = (silu, exp16) if exp16 is not None else None
        silu_ok = bound if bound is not None and _silu_matches_torch(bound) else None
        bf16 = bool(lib.int4_linear_available())  # built where the CPU has AVX512-BF16
        int4_ok = int4 if bf16 else None
        head_ok = _bind(lib.int8_linear_bf16, matmul) if bf16 else None
        argmax = _bind(lib.argmax_rows, [p, i64, i64, i64, p])
        return cls(fn, int8, rms, layer, prefill, linear, int4_ok, step, silu_ok, head_ok, argmax)

    @staticmethod
    def plan(
        planes: tuple[torch.Tensor, ...], fmt: KVFormat, rows: int | torch.Tensor, n: int, heads: int
    ) -> DecodePlan | None:
        """The plan for keys at `rows` (the first of one run, or every row) of the pool-layout
        planes ([layers, kv_heads, size, x]); None where the kernel does not take the layout."""
        k, v = planes[0], planes[1]
        if k.device.type != "cpu" or k.dtype not in CODES or k.stride(-1) != 1 or k.stride(-2) != k.shape[-1]:
            return None
        kvh, hd = k.shape[1], k.shape[3]
        if heads % kvh or heads // kvh > 16 or hd > 256 or kvh > 64 or v.stride() != k.stride():
            return None
        scales = planes[2:4] if fmt.scaled else ()
        if scales and (scales[0].stride(-2) != 1 or scales[0].stride() != scales[1].stride()):
            return None
        idx = None if isinstance(rows, int) else rows.to(torch.int64).contiguous()
        plan = _Plan(
            k.data_ptr(),
            v.data_ptr(),
            scales[0].data_ptr() if scales else None,
            scales[1].data_ptr() if scales else None,
            idx.data_ptr() if idx is not None else None,
            rows if isinstance(rows, int) else 0,
            n,
            k.stride(0),
            k.stride(1),
            scales[0].stride(0) if scales else 0,
            scales[0].stride(1) if scales else 0,
            kvh,
            heads // kvh,
            hd,
            CODES[k.dtype],
            torch.get_num_threads(),
            hd**-0.5,
        )
        keep = (*planes, idx) if idx is not None else planes
        return DecodePlan(plan, keep, heads, hd)

    def __call__(self, plan: DecodePlan, layer: int, q: torch.Tensor) -> torch.Tensor:
        """Layer `layer`'s attention for one query token q ([heads, head_dim] float32): [1, heads * hd]."""
        q = q.contiguous()
        out = torch.empty(1, plan.heads * plan.head_dim, dtype=torch.float32)
        if self.fn(ctypes.byref(plan.plan), layer, q.data_ptr(), out.data_ptr()) != 0:
            raise KernelUnavailable("decode_attention refused its plan")  # plan() checked the shapes
        return out

    def prefill(self, plan: DecodePlan, layer: int, q: torch.Tensor) -> torch.Tensor:
        """Layer `layer`'s attention for the plan's last q.shape[0] positions (q: [n, heads,
        head_dim] float32, their K/V stored): [n, heads * hd]. Each row is the same bits as a
        decode step at its position would give (decode_attention.c's prefill_attention)."""
        n = q.shape[0]
        q = q.contiguous()
        out = torch.empty(n, plan.heads * plan.head_dim, dtype=torch.float32)
        first = plan.plan.n - n
        if self.prefill_fn(ctypes.byref(plan.plan), layer, first, n, q.data_ptr(), out.data_ptr()) != 0:
            raise KernelUnavailable("prefill_attention refused its plan")
        return out

    def layer_step(
        self, plans: DecodePlans, layer: int, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        """The rest of layer `layer`'s attention for one-token requests, from the qkv projection's
        rows h ([count, heads*hd + 2*kv_heads*hd], one per plan) to the o projection's input
        ([count, heads*hd]): rope on q and K with each request's cos/sin rows ([count, hd]), K and
        V stored in the pool's format at its newest row, attention. The same bits as the compact
        forward's torch ops for these steps (runtime/model/model.py), in one call."""
        if h.shape[0] != plans.count or h.dtype not in ACTS or cos.dtype != h.dtype or sin.dtype != h.dtype:
            raise ValueError(f"layer_step: {h.shape[0]} rows of {h.dtype} for {plans.count} plans")
        h, cos, sin = h.contiguous(), cos.contiguous(), sin.contiguous()
        out = torch.empty(h.shape[0], plans.heads * plans.head_dim, dtype=h.dtype)
        args = (h.data_ptr(), h.stride(0), cos.data_ptr(), sin.data_ptr(), out.data_ptr())
        if self.layer_fn(plans.array, plans.count, layer, ACTS[h.dtype], *args) != 0:
            raise KernelUnavailable("decode_layer refused its plans")  # DecodePlans.of checked them
        return out

    def int4_layer(
        self,
        plans: DecodePlans,
        index: int,
        layer: Int4Layer,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        eps: float,
    ) -> torch.Tensor:
        """Layer `index` of an int4 model for one-token requests: x [count, hidden] bf16 (contiguous)
        becomes, in place, the next layer's input, in one call (csrc/decode_step.c): the same
        kernels, and bits, as the forward's separate calls. Needs the native silu (`silu_fn`)."""
        if (
            self.silu_fn is None
            or x.dtype != torch.bfloat16
            or x.shape != (plans.count, layer.hidden)
            or not x.is_contiguous()
        ):
            raise ValueError(f"int4_layer: {x.dtype} {list(x.shape)} for {plans.count} plans")
        cos, sin = cos.contiguous(), sin.contiguous()
        attn = plans.heads * plans.head_dim
        args = (x.data_ptr(), layer.hidden, attn, eps, cos.data_ptr(), sin.data_ptr(), self.silu_fn[1])
        rc = self.step_fn(
            plans.array, plans.count, index, ctypes.byref(layer.struct), *args, torch.get_num_threads()
        )
        if rc != 0:
            raise KernelUnavailable(f"decode_layer_int4 refused layer {index} ({rc})")
        return x

    def silu_mul(self, h: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of h = [m, gate | up]: bf16 rows natively, with torch's bits."""
        if self.silu_fn is None or h.dtype != torch.bfloat16:
            return silu_mul(h)
        out = _silu_call(self.silu_fn, h)
        return silu_mul(h) if out is None else out

    def int8_linear(
        self, x: torch.Tensor, weight: torch.Tensor, scales32: torch.Tensor
    ) -> torch.Tensor | None:
        """x [m, k] times an int8 [n, k] matrix with float32 row scales: float32 [m, n], each row
        the same bits whatever rows share the call; None where the kernel does not take it."""
        m, k = x.shape
        if weight.dtype != torch.int8 or not weight.is_contiguous() or weight.shape[1] != k:
            return None
        if x.dtype == torch.bfloat16 and self.int8_bf16_fn is not None and k % 32 == 0:
            return self._int8_bf16(self.int8_bf16_fn, x.contiguous(), weight, scales32)
        xf = x.float().contiguous()
        out = torch.empty(m, weight.shape[0], dtype=torch.float32)
        args = (xf.data_ptr(), weight.data_ptr(), scales32.data_ptr(), out.data_ptr(), m, weight.shape[0], k)
        if self.int8_fn(*args, torch.get_num_threads()) != 0:
            return None
        return out

    def argmax(self, logits: torch.Tensor) -> list[int]:
        """Each row's torch.argmax of [m, vocab] logits (the first largest, or the first NaN) in
        one native call: torch's read a 49152-entry row in 27 us, this one in a few."""
        if logits.dtype != torch.float32 or logits.dim() != 2 or logits.stride(1) != 1 or not logits.shape[1]:
            return logits.argmax(dim=-1).tolist()
        m, n = logits.shape
        out = torch.empty(m, dtype=torch.int64)
        self.argmax_fn(logits.data_ptr(), m, n, logits.stride(0), out.data_ptr())
        return out.tolist()

    @staticmethod
    def _int8_bf16(
        fn: ctypes._CFuncPtr,  # type: ignore[name-defined]
        x: torch.Tensor,
        weight: torch.Tensor,
        scales32: torch.Tensor,
    ) -> torch.Tensor:
        """bf16 rows (the quantized models' activations): pair dot products from 3 rows on, FMAs
        below, the same bits either way (csrc/decode_attention.c `int8_linear_bf16`): ~1.6x the
        float32 kernel at a 16-request step. Never the float32 kernel instead: its sums differ."""
        m, k = x.shape
        out = torch.empty(m, weight.shape[0], dtype=torch.float32)
        args = (x.data_ptr(), weight.data_ptr(), scales32.data_ptr(), out.data_ptr(), m, weight.shape[0], k)
        if fn(*args, torch.get_num_threads()) != 0:
            raise MemoryError(f"int8_linear_bf16: no memory for {m} rows of {k}")
        return out

    def int4_linear(self, x: torch.Tensor, tiles: torch.Tensor, sz: torch.Tensor, group: int) -> torch.Tensor:
        """x [m, k] bf16 times an int4 [n, k] matrix in csrc/int4_linear.c's layout (`tiles`: n*k/2
        bytes, `sz` [n/16, k/group, 2, 16] bf16 scales and zeros): [m, n] bf16, each row the same
        bits whatever rows share the call."""
        if self.int4_fn is None:
            raise KernelUnavailable("this CPU has no AVX512-BF16: the int4 kernel was not built")
        x = x.contiguous()
        m, k = x.shape
        n = sz.shape[0] * 16
        if x.dtype != torch.bfloat16 or tiles.numel() * 2 != n * k or sz.shape[1] * group != k:
            raise ValueError(
                f"int4_linear: {x.dtype} [{m}, {k}] times an int4 [{n}, {tiles.numel() * 2 // n}]"
            )
        out = torch.empty(m, n, dtype=torch.bfloat16)
        args = (x.data_ptr(), tiles.data_ptr(), sz.data_ptr(), out.data_ptr(), m, n, k, group)
        if self.int4_fn(*args, torch.get_num_threads()) != 0:
            raise ValueError(f"int4_linear refused [{m}, {k}] x [{n}, {k}] in groups of {group}")
        return out

    def linear_f32(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [m, k] @ weight [n, k]^T (+ bias) in float32 with every output summed in one fixed
        order: a row's result is the same bits whatever rows share the call (deterministic
        inference; MKL's sgemm changes its blocking, and so the last bits, with the row count)."""
        x = x.contiguous()
        m, k = x.shape
        if weight.dtype != torch.float32 or x.dtype != torch.float32 or weight.shape[1] != k:
            raise ValueError(f"linear_f32: {x.dtype} [{m}, {k}] times {weight.dtype} {list(weight.shape)}")
        w = weight.contiguous()
        b = None if bias is None else bias.float().contiguous()
        out = torch.empty(m, w.shape[0], dtype=torch.float32)
        args = (
            x.data_ptr(),
            w.data_ptr(),
            None if b is None else b.data_ptr(),
            out.data_ptr(),
            m,
            w.shape[0],
            k,
        )
        if self.linear_fn(*args, torch.get_num_threads()) != 0:
            raise ValueError(f"linear_f32 refused [{m}, {k}] x {list(w.shape)}")
        return out

    def rms_norm_bf16(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """The compact forward's RMSNorm on bfloat16 rows [m, k], the same bits as its torch ops
        (fp32 math, rounded to bf16, times the bf16 weight, rounded), in one call."""
        x = x.contiguous()
        out = torch.empty_like(x)
        self.rms_fn(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], eps)
        return out


def silu_mul(h: torch.Tensor) -> torch.Tensor:
    """The MLP's activation, silu(gate) * up, of h = [m, gate | up] with torch's ops."""
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up


def _silu_call(fn: tuple[ctypes._CFuncPtr, int], h: torch.Tensor) -> torch.Tensor | None:  # type: ignore[name-defined]
    h = h.contiguous()
    out = torch.empty(h.shape[0], h.shape[1] // 2, dtype=h.dtype)
    return out if fn[0](h.data_ptr(), out.data_ptr(), h.shape[0], h.shape[1] // 2, fn[1]) == 0 else None


def _torch_exp16() -> int | None:
    """The address of the vectorised exp torch's CPU ops use (SLEEF's, in libtorch_cpu)."""
    try:
        lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        return ctypes.cast(lib.Sleef_expf16_u10, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None


def _silu_matches_torch(fn: tuple[ctypes._CFuncPtr, int]) -> bool:  # type: ignore[name-defined]
    """Whether the native silu * up gives torch's bits for every finite bf16 gate (times up)."""
    gate = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    gate = gate[torch.isfinite(gate)]
    gate = gate[: gate.numel() // 16 * 16]
    up = torch.randn(gate.numel(), generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    h = torch.cat([gate, up]).view(1, -1)
    ours = _silu_call(fn, h)
    return ours is not None and torch.equal(ours, silu_mul(h))


def _cache_dir() -> Path:
    """$RADIXAGENT_KERNEL_DIR, else $XDG_CACHE_HOME/radixagent/kernels (~/.cache by default)."""
    if os.environ.get("RADIXAGENT_KERNEL_DIR"):
        return Path(os.environ["RADIXAGENT_KERNEL_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "radixagent" / "kernels"


def compiler() -> str:
    """The C compiler the kernels are built with: $CC, else cc."""
    return os.environ.get("CC") or "cc"


def _build(cache_dir: Path) -> Path:
    cc = compiler()
    if shutil.which(cc) is None:
        raise KernelUnavailable(f"no C compiler ({cc!r} is not on PATH; set CC)")
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise KernelUnavailable(f"{cc} --version failed: {e}") from e
    # -march=native: the CPU is part of the key (a cache on a shared home may see other CPUs)
    key = hashlib.sha256(
        "\0".join([*(s.read_text() for s in SOURCES), *FLAGS, *LINK, version, _cpu_flags()]).encode()
    ).hexdigest()[:16]
    path = cache_dir / f"decode_attention-{key}.so"
    if path.exists():
        return path
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        objs = [str(Path(tmp) / f"{s.stem}.o") for s in SOURCES]
        for src, obj in zip(SOURCES, objs, strict=True):
            _run([cc, *FLAGS, "-c", "-o", obj, str(src)])
        lib = Path(tmp) / "decode_attention.so"
        _run([cc, *LINK, "-o", str(lib), *objs, "-lm"])
        os.replace(lib, path)  # atomic: concurrent builders each leave a whole file
    return path


def _run(cmd: list[str]) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        raise KernelUnavailable(f"building the decode kernel failed: {e}") from e
    if done.returncode != 0:
        raise KernelUnavailable(
            f"{' '.join(cmd[:2])} failed building the decode kernel: {done.stderr.strip()[-400:]}"
        )


def _cpu_flags() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    return next((line for line in info.splitlines() if line.startswith("flags")), "")
