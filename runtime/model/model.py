"""A compact forward pass for llama-family models (Llama 2/3.x, SmolLM2, Qwen2, Qwen3, Mistral).

Per-step overhead, not arithmetic, limits a 135M model on a CPU, so each layer is a handful
of fused matmuls. Linear layers run over all tokens of a step at once (every request in
the batch); attention runs per request over that request's own contiguous KV buffer.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from runtime.cache.kv_format import KVFormat
from runtime.cache.seq_kv import SeqKV
from runtime.model.attention import InvariantAttention, padded_length
from runtime.model.config import SUPPORTED, ModelConfig, UnsupportedModel
from runtime.model.decode_kernel import (
    ACTS,
    DecodeKernel,
    DecodePlan,
    DecodePlans,
    Int4Layer,
    KernelUnavailable,
    silu_mul,
)
from runtime.model.quant import Dense, Int4Tiles, Int8, Linear, WeightFormat
from runtime.model.rope import tables

log = logging.getLogger(__name__)

__all__ = ["SUPPORTED", "LlamaModel", "ModelConfig", "Segment", "SeqKV", "UnsupportedModel"]


@dataclass(slots=True)
class Segment:
    """New tokens of one request in this step: ids [n] at positions kv.length .. kv.length+n-1."""

    kv: SeqKV
    ids: list[int]
    #: >= 0: also keep the logits of ids[logits_from:] in `prompt_logits` (prompt logprobs)
    logits_from: int = -1
    prompt_logits: torch.Tensor | None = None  # [n - logits_from, vocab] float32, set by forward


@dataclass(frozen=True, slots=True)
class Layer:
    ln1: torch.Tensor
    qkv: Linear  # q, k and v projections fused: one matmul
    o: Linear
    ln2: torch.Tensor
    gate_up: Linear  # gate and up projections fused
    down: Linear
    #: Qwen3's per-head RMSNorm weights before the rope: q_norm for each query head, then k_norm
    #: for each KV head, [heads + kv_heads, head_dim] (None: no q/k norm)
    qk_norm: torch.Tensor | None = None


class LlamaModel:
    def __init__(
        self,
        cfg: ModelConfig,
        state: dict[str, torch.Tensor],
        dtype: torch.dtype,
        device: str,
        torchao_config: str | None = None,
    ) -> None:
        self.cfg, self.dtype, self.device = cfg, dtype, device
        self.torchao_config = torchao_config
        # CPU attention kernels are 4-15x slower in bf16/fp16 than in fp32 (evals/benchmarks/kv_attention.py):
        # on the CPU attention runs in fp32 whatever the weights are. How K/V is *stored* is the
        # engine's kv_cache_dtype (each SeqKV's format); stored otherwise, it is converted per layer.
        self.kv_dtype = torch.float32 if device == "cpu" else dtype
        fmt = WeightFormat(dtype, device, torchao_config, _int4_kernel(device, torchao_config))

        def w(name: str) -> torch.Tensor:
            return state[name].to(device=device, dtype=dtype).contiguous()

        tied = cfg.tie_embeddings or "lm_head.weight" not in state
        self.lm_head = fmt.head(state["model.embed_tokens.weight" if tied else "lm_head.weight"])
        self._embed: Callable[[torch.Tensor], torch.Tensor]
        if isinstance(self.lm_head, Int8):
            self._embed = self.lm_head.rows if tied else w("model.embed_tokens.weight").__getitem__
        else:
            table = self.lm_head.weight if tied else w("model.embed_tokens.weight")
            self._embed = table.__getitem__
        self.norm = w("model.norm.weight")
        self.layers = [self._layer(cfg, fmt, w, state, f"model.layers.{i}.") for i in range(cfg.layers)]
        # [pos, head_dim], HF's rotate_half layout; a GGUF's rope_freqs divides the frequencies
        self.cos, self.sin = tables(
            cfg.rotary, cfg.head_dim, cfg.max_positions, device, dtype, state.get(ROPE_FREQS)
        )
        self.invariant = InvariantAttention.build(cfg.heads, cfg.kv_heads, cfg.head_dim, device)
        # MKL's dense fp32 matmuls give other last bits for 1-3, 5-7 and 9-11 rows than for the
        # same rows among more (measured); the int4/int8 kernels and bf16 are row-independent
        self._dense = isinstance(self.layers[0].qkv, Dense) and dtype != torch.bfloat16
        self._int4_layers = _int4_layers(self.layers)

    @staticmethod
    def _layer(
        cfg: ModelConfig,
        fmt: WeightFormat,
        w: Callable[[str], torch.Tensor],
        state: dict[str, torch.Tensor],
        p: str,
    ) -> Layer:
        """One decoder layer; biases wherever the checkpoint has them (Qwen2's q/k/v, Llama's
        `attention_bias` on q/k/v/o, `mlp_bias`)."""
        a, m = p + "self_attn.", p + "mlp."
        qkv = torch.cat([state[a + f"{x}_proj.weight"] for x in "qkv"])
        gate_up = torch.cat([state[m + "gate_proj.weight"], state[m + "up_proj.weight"]])
        qk_norm = None
        if cfg.qk_norm:
            qn, kn = w(a + "q_norm.weight"), w(a + "k_norm.weight")
            qk_norm = torch.cat([qn.expand(cfg.heads, -1), kn.expand(cfg.kv_heads, -1)]).contiguous()
        return Layer(
            w(p + "input_layernorm.weight"),
            fmt.linear(qkv, _fused_bias(state, [a + f"{x}_proj.bias" for x in "qkv"])),
            fmt.linear(state[a + "o_proj.weight"], state.get(a + "o_proj.bias")),
            w(p + "post_attention_layernorm.weight"),
            fmt.linear(gate_up, _fused_bias(state, [m + "gate_proj.bias", m + "up_proj.bias"])),
            fmt.linear(state[m + "down_proj.weight"], state.get(m + "down_proj.bias")),
            qk_norm,
        )

    @property
    def weight_bytes(self) -> int:
        """Bytes streamed per decode step (what bounds CPU decode speed)."""
        linears = [m for layer in self.layers for m in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        return sum(m.nbytes for m in linears) + self.lm_head.nbytes

    @classmethod
    def random(
        cls,
        cfg: ModelConfig,
        dtype: torch.dtype,
        device: str,
        seed: int = 0,
        torchao_config: str | None = None,
    ) -> LlamaModel:
        """Seeded random weights of the right shapes (GPU timing where no weights can be brought)."""
        g = torch.Generator().manual_seed(seed)
        q, kv = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        shapes = {
            "model.embed_tokens.weight": (cfg.vocab_size, cfg.hidden),
            "model.norm.weight": (cfg.hidden,),
        }
        for i in range(cfg.layers):
            p = f"model.layers.{i}."
            shapes |= {
                p + "self_attn.q_proj.weight": (q, cfg.hidden),
                p + "self_attn.k_proj.weight": (kv, cfg.hidden),
                p + "self_attn.v_proj.weight": (kv, cfg.hidden),
                p + "self_attn.o_proj.weight": (cfg.hidden, q),
                p + "mlp.gate_proj.weight": (cfg.intermediate, cfg.hidden),
                p + "mlp.up_proj.weight": (cfg.intermediate, cfg.hidden),
                p + "mlp.down_proj.weight": (cfg.hidden, cfg.intermediate),
                p + "input_layernorm.weight": (cfg.hidden,),
                p + "post_attention_layernorm.weight": (cfg.hidden,),
            }
            if cfg.qk_norm:
                shapes |= {p + f"self_attn.{x}_norm.weight": (cfg.head_dim,) for x in "qk"}
        state = {
            k: (torch.ones(s) if len(s) == 1 else torch.randn(s, generator=g) * 0.02)
            for k, s in shapes.items()
        }
        return cls(cfg, state, dtype, device, torchao_config)

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # One fused op, bit-identical to HF's LlamaRMSNorm (fp32 math, cast back, then the weight):
        # a 135M model's step is ~40 small ops per layer, so op count is speed.
        return F.rms_norm(x.float(), (x.shape[-1],), None, self.cfg.eps).to(x.dtype) * weight

    def _qk_norm(self, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """Qwen3's q_norm / k_norm: RMSNorm over each head's head_dim on the q and k parts of the
        qkv rows h, as HF's Qwen3RMSNorm rounds it; v passes unchanged."""
        cfg = self.cfg
        qk_width = (cfg.heads + cfg.kv_heads) * cfg.head_dim
        qk = h[:, :qk_width].reshape(-1, cfg.heads + cfg.kv_heads, cfg.head_dim)
        normed = self._rms(qk, weight).reshape(-1, qk_width)
        return torch.cat([normed, h[:, qk_width:]], dim=-1)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def exact(self, deterministic: bool, kernel: DecodeKernel | None) -> bool:
        """Whether steps run the exact fast path: every token computed with the arithmetic of a
        decode step at its position (the native kernel's attention for prompt rows too, one norm
        and one lm_head kernel for every row count), so its logits and K/V are the same bits cold,
        cached, batched or in any chunk, at the decode kernel's speed. Needs the kernel, bf16 or
        float32 activations, and matmuls whose rows do not depend on the rows beside them:
        quantized weights (torch's int4/int8 kernels are), or the deterministic flag (float32:
        `linear_f32`)."""
        if kernel is None or self.dtype not in ACTS or self.device != "cpu":
            return False
        return deterministic or not isinstance(self.layers[0].qkv, Dense)

    @torch.inference_mode()
    def forward(
        self, segments: list[Segment], deterministic: bool = False, decode_kernel: DecodeKernel | None = None
    ) -> torch.Tensor:
        """Runs every segment's new tokens; returns logits of each segment's last token: [S, vocab].

        Appends the new tokens' K/V to each segment's SeqKV (length advances). `deterministic`:
        batch-invariant kernels (runtime/model/attention.py), so a token's logits and K/V are the same
        bits whichever requests, chunk or cache hit it is computed with. `decode_kernel`: one-token
        segments' attention read straight from the stored KV format (runtime/model/decode_kernel.py),
        and on the exact path (`exact`) every segment's; None: PyTorch's SDPA over float32 K/V.
        """
        cfg = self.cfg
        lens = [len(s.ids) for s in segments]
        ids = torch.tensor([t for s in segments for t in s.ids], device=self.device)
        pos = torch.cat([torch.arange(s.kv.length, s.kv.length + len(s.ids)) for s in segments]).to(
            self.device
        )
        cos_rows, sin_rows = self.cos[pos], self.sin[pos]  # [N, hd]
        cos, sin = cos_rows.unsqueeze(1), sin_rows.unsqueeze(1)
        # a step of one-token requests only (decode): rope, K/V store and attention in one native
        # call per layer (the same bits as the torch ops below, ~20 fewer ops per layer), and no
        # per-layer views of the planes to build
        exact = self.exact(deterministic, decode_kernel)
        blocked = deterministic and not exact  # InvariantAttention: no kernel, or float16
        kernel = None if blocked else decode_kernel
        plans = self._decode_plans(segments, kernel)
        views = [] if plans is not None else self._views(segments, lens, blocked, kernel, exact)
        scratch = self._scratch(views, blocked)
        mm, rms, act = self._step_ops(deterministic, exact, decode_kernel, len(ids))
        x = self._embed(ids)  # [N, hidden]
        qd, kd = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        if plans is not None and exact and self._int4_layers and kernel is not None and kernel.silu_fn:
            # a decode step of an int4 model: each layer one native call (csrc/decode_step.c)
            x = x.contiguous()
            for li, fused in enumerate(self._int4_layers):
                x = kernel.int4_layer(plans, li, fused, x, cos_rows, sin_rows, cfg.eps)
            return self._finish(segments, lens, x, exact, kernel, mm, rms)
        for li, layer in enumerate(self.layers):
            h = mm(layer.qkv, rms(x, layer.ln1))  # [N, qd + 2 kd]
            if layer.qk_norm is not None:
                h = self._qk_norm(h, layer.qk_norm)
            if plans is not None:
                assert kernel is not None
                attn = kernel.layer_step(plans, li, h, cos_rows, sin_rows)
            else:
                qk = self._rope(h[:, : qd + kd].view(-1, cfg.heads + cfg.kv_heads, cfg.head_dim), cos, sin)
                q, k = qk[:, : cfg.heads], qk[:, cfg.heads :]  # rotated together: half the ops
                v = h[:, qd + kd :].view(-1, cfg.kv_heads, cfg.head_dim)
                attn = self._attend(li, views, lens, q, k, v, scratch, kernel)  # [N, qd]
            x = x + mm(layer.o, attn)
            x = x + mm(layer.down, act(mm(layer.gate_up, rms(x, layer.ln2))))
        return self._finish(segments, lens, x, exact, kernel, mm, rms)

    def _finish(
        self,
        segments: list[Segment],
        lens: list[int],
        x: torch.Tensor,
        exact: bool,
        kernel: DecodeKernel | None,
        mm: Callable[..., torch.Tensor],
        rms: Callable[..., torch.Tensor],
    ) -> torch.Tensor:
        """After the last layer: each segment's K/V length advances; the logits asked for."""
        for s, n in zip(segments, lens, strict=True):
            s.kv.length += n
        ends = torch.tensor(lens).cumsum(0)
        head = functools.partial(self._lm_head, mm=mm, kernel=kernel, every_count=exact)
        if any(s.logits_from >= 0 for s in segments):
            # the exact path's prompt rows: the same norm and head kernels as a step's last rows
            return self._logits_with_prompt(segments, x, ends.tolist(), rms if exact else self._rms, head)
        return head(rms(x[(ends - 1).to(self.device)], self.norm))

    def _lm_head(
        self,
        x: torch.Tensor,
        mm: Callable[[Linear, torch.Tensor], torch.Tensor],
        kernel: DecodeKernel | None,
        every_count: bool,
    ) -> torch.Tensor:
        """Logits [m, vocab] float32 of final-norm rows x. A quantized model's int8 lm_head, the
        largest matrix of its step, runs natively at the memory's speed: for a decode step's few
        rows, and on the exact path for any number (its rows do not depend on the rows beside
        them; torch's int8 kernel batches more rows faster but sums in another order)."""
        if kernel is not None and isinstance(self.lm_head, Int8) and (every_count or x.shape[0] <= 4):
            logits = kernel.int8_linear(x, self.lm_head.weight, self.lm_head.scales32)
            if logits is not None:
                return logits
        return mm(self.lm_head, x).float()

    def _views(
        self,
        segments: list[Segment],
        lens: list[int],
        blocked: bool,
        kernel: DecodeKernel | None,
        exact: bool,
    ) -> list[_Views]:
        args = (self.device, self.kv_dtype, blocked, kernel, self.cfg.heads, exact)
        return [_Views.of(s.kv, n, *args) for s, n in zip(segments, lens, strict=True)]

    def _step_ops(
        self, deterministic: bool, exact: bool, decode_kernel: DecodeKernel | None, tokens: int
    ) -> tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor], Callable[..., torch.Tensor]]:
        """The step's matmul, norm and activation: batch-invariant matmuls when `deterministic`,
        the native norm for every row count on the exact path (its rows do not depend on the
        count; torch's and the native norm sum in other orders), native one-call ones for a small
        bf16 decode step, torch's otherwise."""
        mm = self._invariant_mm(decode_kernel) if deterministic and self._dense else _call
        small = not deterministic and tokens <= 16
        if decode_kernel is not None and self.dtype == torch.bfloat16 and (exact or small):
            # a decode step's norms: one native call each instead of ~6 small torch ops (~35 us);
            # silu_mul: torch's bits, one call instead of chunk, silu and mul (torch's own for
            # many rows: the same bits, over all the cores)
            return (
                mm,
                functools.partial(decode_kernel.rms_norm_bf16, eps=self.cfg.eps),
                decode_kernel.silu_mul if tokens <= 16 else silu_mul,
            )
        return mm, self._rms, silu_mul

    def _decode_plans(self, segments: list[Segment], kernel: DecodeKernel | None) -> DecodePlans | None:
        """Every segment's native plan when the step is one new token each, else None."""
        if kernel is None or any(len(s.ids) != 1 for s in segments):
            return None
        plans = []
        for s in segments:
            plan = kernel.plan(
                s.kv.planes, s.kv.format, _rows(s.kv, 1, s.kv.length + 1), s.kv.length + 1, self.cfg.heads
            )
            if plan is None:
                return None
            plans.append(plan)
        return DecodePlans.of(plans, self.dtype)

    def _invariant_mm(self, kernel: DecodeKernel | None) -> Callable[[Linear, torch.Tensor], torch.Tensor]:
        """Dense matmuls whose rows do not depend on the rows beside them: the native fixed-order
        float32 kernel, or, without it, MKL with the row counts padded (`_rows_invariant`)."""
        if kernel is None or self.dtype != torch.float32:
            return self._rows_invariant

        def mm(f: Linear, x: torch.Tensor) -> torch.Tensor:
            assert isinstance(f, Dense)  # _dense: every linear layer is
            return kernel.linear_f32(x, f.weight, f.bias)

        return mm

    @staticmethod
    def _rows_invariant(f: Linear, x: torch.Tensor) -> torch.Tensor:
        """f(x) computed as MKL computes rows among many: fewer than 12 rows go in as a multiple
        of 4, zero rows added and their outputs dropped. Measured on an AMD EPYC (4 and 8 rows like
        12 and more); an Intel Xeon's MKL differs up to 15 rows and at some larger counts, so this
        is only the fallback where the native kernel cannot be built (`_invariant_mm`)."""
        m = x.shape[0]
        if m >= 12 or m % 4 == 0:
            return f(x)
        return f(torch.cat([x, x.new_zeros(4 - m % 4, x.shape[1])]))[:m]

    def _logits_with_prompt(
        self,
        segments: list[Segment],
        x: torch.Tensor,
        ends: list[int],
        rms: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        head: Callable[[torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """Last-token logits [S, vocab], and every row from `logits_from` on where a segment asks."""
        spans = [
            (end - len(s.ids) + s.logits_from if s.logits_from >= 0 else end - 1, end)
            for s, end in zip(segments, ends, strict=True)
        ]
        rows = torch.cat([torch.arange(a, b) for a, b in spans]).to(self.device)
        logits = head(rms(x[rows], self.norm))
        parts = logits.split([b - a for a, b in spans])
        for s, part in zip(segments, parts, strict=True):
            if s.logits_from >= 0:
                s.prompt_logits = part
        return torch.stack([part[-1] for part in parts])

    def _scratch(self, views: list[_Views], zeros: bool) -> tuple[torch.Tensor, torch.Tensor] | None:
        """One layer's K and V in the compute dtype, for formats stored otherwise and for requests
        whose positions are scattered over the pool: each layer's K/V is converted or gathered
        into it just before its attention, so the copy is still in cache when SDPA reads it.
        Per call, not per model: sibling engines run the model concurrently. `zeros`: attention
        reads whole blocks, past what is copied in, and those rows must be finite."""
        longest = max((vw.span for vw in views if vw.needs_scratch), default=0)
        if not longest:
            return None
        shape = (self.cfg.kv_heads, longest, self.cfg.head_dim)
        make = torch.zeros if zeros else torch.empty
        return (
            make(shape, dtype=self.kv_dtype, device=self.device),
            make(shape, dtype=self.kv_dtype, device=self.device),
        )

    def _attend(
        self, li: int, views: list[_Views], lens: list[int], q, k, v, scratch, kernel: DecodeKernel | None
    ) -> torch.Tensor:
        # Per request and layer this is a few ops on views prepared once per step: with several
        # requests in a step, per-op overhead here outweighed the attention arithmetic (measured).
        qs, ks, vs = q.to(self.kv_dtype).split(lens), k.split(lens), v.split(lens)
        outs = []
        for vw, n, qi, ki, vi in zip(views, lens, qs, ks, vs, strict=True):
            if vw.decode is not None:
                assert kernel is not None
                vw.store(li, ki.transpose(0, 1), vi.transpose(0, 1))
                outs.append(kernel(vw.decode, li, qi[0]) if n == 1 else kernel.prefill(vw.decode, li, qi))
                continue
            k_all, v_all = vw.keys_values(li, ki.transpose(0, 1), vi.transpose(0, 1), scratch)
            if vw.deterministic:
                outs.append(self.invariant(qi, k_all[0], v_all[0], vw.length - n))
                continue
            # [n, H, hd] -> [1, H, n, hd]; for one token that is a view
            qi = qi.view(1, -1, 1, qi.shape[-1]) if n == 1 else qi.transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(
                qi, k_all, v_all, attn_mask=vw.mask, is_causal=vw.causal, enable_gqa=True
            )
            outs.append(o.view(1, -1) if n == 1 else o[0].transpose(0, 1).reshape(n, -1))
        return (outs[0] if len(outs) == 1 else torch.cat(outs)).to(self.dtype)


#: the state-dict key of per-frequency rope divisors (a Llama 3 GGUF's `rope_freqs`, see model_files)
ROPE_FREQS = "rope_freqs"


def _fused_bias(state: dict[str, torch.Tensor], names: list[str]) -> torch.Tensor | None:
    """The fused projection's bias: every part's, None when none has one (a missing part is zeros)."""
    found = [state.get(n) for n in names]
    if all(b is None for b in found):
        return None
    weights = [state[n.removesuffix("bias") + "weight"] for n in names]
    parts = [b if b is not None else wt.new_zeros(wt.shape[0]) for b, wt in zip(found, weights, strict=True)]
    return torch.cat(parts)


def _int4_layers(layers: list[Layer]) -> list[Int4Layer] | None:
    """Each layer's weights for the one-call decode layer, where it can run them: int4 tiles
    throughout, no biases, no q/k norm."""
    parts = [(la.qkv, la.o, la.gate_up, la.down) for la in layers]
    if not all(isinstance(p, Int4Tiles) and p.bias is None for ps in parts for p in ps):
        return None
    if any(la.qk_norm is not None for la in layers):
        return None
    return [
        Int4Layer.of(la.ln1, la.ln2, [(p.tiles, p.scales_zeros) for p in ps], ps[0].group)  # type: ignore[union-attr]
        for la, ps in zip(layers, parts, strict=True)
    ]


def _int4_kernel(device: str, torchao_config: str | None) -> DecodeKernel | None:
    """The native kernels for int4 layers (their matmul: up to 2.1x torch's, csrc/int4_linear.c),
    whatever attention backend the engine picks; None: torch's int4 matmul."""
    if device != "cpu" or not (torchao_config or "").startswith("int4wo"):
        return None
    try:
        return DecodeKernel.load()
    except KernelUnavailable as e:
        log.warning("native int4 matmul unavailable (%s): torch's int4 kernel", e)
        return None


def _call(f: Linear, x: torch.Tensor) -> torch.Tensor:
    return f(x)


def _rows(kv: SeqKV, n: int, span: int) -> int | torch.Tensor:
    """Where a step with n new tokens reads kv's positions: the first row of one run whose
    `span` rows fit the planes, else every row."""
    m = kv.length
    at = kv.rows(0, m + n)
    if isinstance(at, int) and at + span > kv.k.shape[2]:  # a run at the planes' end, past their padding
        return torch.arange(at, at + m + n, device=kv.k.device)
    return at


@dataclass(frozen=True, slots=True)
class _Views:
    """One request's per-layer K/V access for a step. When its m + n positions are one run of
    rows (consecutive pool slots): views of what attention reads (`k`, `v`:
    [1, KVH, span, hd] per layer, as stored; `stored`: every plane over those rows, for formats
    that convert) and of where the n new tokens go (`new`: every plane, [KVH, n, x]). When they
    are scattered over the pool: `idx` / `new_idx` (rows), `planes`, and a gather per layer.

    `span`: the rows attention reads, m + n, or whole blocks of them when `deterministic`
    (runtime/model/attention.py; rows past m + n are masked there).

    Query i sees the prefix and new tokens <= i (bottom-right aligned causal). Without a prefix
    that is SDPA's own `is_causal`, which skips masked blocks (~25% faster at 1k tokens); with one,
    an additive mask built once per step instead of a boolean one converted in every layer."""

    k: tuple[torch.Tensor, ...]
    v: tuple[torch.Tensor, ...]
    stored: list[tuple[torch.Tensor, ...]]
    new: list[tuple[torch.Tensor, ...]]
    mask: torch.Tensor | None  # None for one new token (it sees everything), when `causal`, or deterministic
    causal: bool
    fmt: KVFormat
    length: int  # m + n
    span: int
    deterministic: bool
    planes: tuple[torch.Tensor, ...] = ()  # gather mode: the pool's planes
    idx: torch.Tensor | None = None  # gather mode: rows of the m + n positions
    new_idx: torch.Tensor | None = None  # gather mode: rows of the n new ones
    #: read by the native kernel from the planes: one new token, or any number on the exact path
    decode: DecodePlan | None = None

    @property
    def needs_scratch(self) -> bool:
        return self.decode is None and (self.fmt.converts or self.idx is not None)

    def store(self, li: int, k_new: torch.Tensor, v_new: torch.Tensor) -> None:
        """Writes layer li's new K/V ([KVH, n, hd]) where the n new positions live."""
        if self.idx is not None:
            assert self.new_idx is not None
            self.fmt.store_at(tuple(p[li] for p in self.planes), self.new_idx, k_new, v_new)
        else:
            self.fmt.store(self.new[li], k_new, v_new)

    def keys_values(self, li: int, k_new, v_new, scratch) -> tuple[torch.Tensor, torch.Tensor]:
        """Stores layer li's new K/V ([KVH, n, hd]), then returns the span as [1, KVH, span, hd]."""
        self.store(li, k_new, v_new)
        if self.idx is not None:
            layer = tuple(p[li] for p in self.planes)
            k_all, v_all = scratch[0][:, : self.length], scratch[1][:, : self.length]
            if self.fmt.converts:
                self.fmt.load(tuple(p.index_select(1, self.idx) for p in layer), k_all, v_all)
            else:
                torch.index_select(layer[0], 1, self.idx, out=k_all)
                torch.index_select(layer[1], 1, self.idx, out=v_all)
            return scratch[0][:, : self.span].unsqueeze(0), scratch[1][:, : self.span].unsqueeze(0)
        if self.fmt.converts:
            k_all, v_all = scratch[0][:, : self.span], scratch[1][:, : self.span]
            self.fmt.load(self.stored[li], k_all, v_all)
            return k_all.unsqueeze(0), v_all.unsqueeze(0)
        return self.k[li], self.v[li]

    @classmethod
    def of(
        cls,
        kv: SeqKV,
        n: int,
        device: str,
        dtype: torch.dtype,
        deterministic: bool,
        kernel: DecodeKernel | None,
        heads: int,
        exact: bool = False,
    ) -> _Views:
        m = kv.length  # positions already stored for this request (prefix)
        span = padded_length(m + n) if deterministic else m + n
        fmt, causal = kv.format, n > 1 and m == 0
        at = _rows(kv, n, span)
        plan = None
        if kernel is not None and (n == 1 or exact) and not deterministic:
            plan = kernel.plan(kv.planes, fmt, at, m + n, heads)
        mask = None
        if n > 1 and m > 0 and not deterministic and plan is None:
            seen = (
                torch.arange(m + n, device=device)[None, :] <= (m + torch.arange(n, device=device))[:, None]
            )
            mask = torch.zeros(seen.shape, dtype=dtype, device=device).masked_fill_(~seen, float("-inf"))
        if not isinstance(at, int):
            return cls(
                (), (), [], [], mask, causal, fmt, m + n, span, deterministic, kv.planes, at, at[m:], plan
            )
        a = at  # the first row of the run
        new = list(zip(*(p[:, :, a + m : a + m + n].unbind(0) for p in kv.planes), strict=True))
        stored = (
            list(zip(*(p[:, :, a : a + span].unbind(0) for p in kv.planes), strict=True))
            if fmt.converts and plan is None
            else []
        )
        return cls(
            kv.k[:, :, a : a + span].unsqueeze(1).unbind(0),
            kv.v[:, :, a : a + span].unsqueeze(1).unbind(0),
            stored,
            new,
            mask,
            causal,
            fmt,
            m + n,
            span,
            deterministic,
            decode=plan,
        )
