"""The native decode kernel (runtime/model/decode_kernel.py) against PyTorch's SDPA, and its fallbacks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from runtime.cache.kv_format import KVFormat
from runtime.config import EngineConfig
from runtime.engine.build import decode_kernel
from runtime.model.decode_kernel import DecodeKernel, KernelUnavailable


@pytest.fixture(scope="module")
def kernel() -> DecodeKernel:
    return DecodeKernel.load()


def _planes(fmt: KVFormat, layers: int, kvh: int, rows: int, hd: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(layers, kvh, rows, hd, generator=g) * 2
    v = torch.randn(layers, kvh, rows, hd, generator=g)
    planes = fmt.alloc(layers, kvh, rows + 64, hd, "cpu", zeros=True)
    for i in range(layers):
        fmt.store(tuple(p[i][:, :rows] for p in planes), k[i], v[i])
    return planes


def _reference(fmt: KVFormat, planes, layer: int, rows: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """SDPA over the stored K/V converted to float32 (what torch_native computes)."""
    kvh, hd = planes[0].shape[1], planes[0].shape[3]
    k = torch.empty(kvh, len(rows), hd)
    v = torch.empty(kvh, len(rows), hd)
    fmt.load(tuple(p[layer].index_select(1, rows) for p in planes), k, v)
    out = F.scaled_dot_product_attention(
        q.view(1, -1, 1, hd), k.unsqueeze(0), v.unsqueeze(0), enable_gqa=True
    )
    return out.reshape(1, -1)


def _assert_matches_sdpa(out: torch.Tensor, fmt: KVFormat, planes, layer: int, rows, q: torch.Tensor) -> None:
    """The kernel against SDPA, within float32 rounding that depends on the inputs, not on a CPU.

    The two sum a score's d products in different orders (and call different expf builds: glibc's
    libmvec on one vendor, torch's SLEEF on another), so a score may differ by about
    eps * scale * sum|q_i k_i|; a weight then moves by that much relative, and the output by that
    times |v|. The fixed 2e-6 covers the sums over keys, as measured on Intel and AMD CPUs. A peaked
    head (large scores) gets a proportionally larger bound, the smooth ones keep about 2e-6.
    """
    rows = torch.arange(rows[0], rows[1]) if isinstance(rows, tuple) else rows
    kvh, hd = planes[0].shape[1], planes[0].shape[3]
    k = torch.empty(kvh, len(rows), hd)
    v = torch.empty(kvh, len(rows), hd)
    fmt.load(tuple(p[layer].index_select(1, rows) for p in planes), k, v)
    group = q.shape[0] // kvh
    abs_scores = q.abs().view(kvh, group, hd) @ k.abs().transpose(1, 2) / hd**0.5  # [kvh, group, n]
    score_err = torch.finfo(torch.float32).eps * abs_scores.max().item()
    atol = 2e-6 + score_err * v.abs().max().item()
    ref = _reference(fmt, planes, layer, rows, q)
    torch.testing.assert_close(out, ref, atol=atol, rtol=1e-4)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "int8"])
@pytest.mark.parametrize("n", [1, 15, 16, 17, 255, 256, 257, 1000])
def test_matches_sdpa_over_contiguous_rows(kernel, dtype, n):
    """SmolLM2's shape (9 query heads over 3 KV heads, hd 64): chunk edges at 16 and 256 keys."""
    fmt = KVFormat.resolve(dtype, torch.float32, torch.float32)
    planes = _planes(fmt, 2, 3, n + 5, 64, seed=n)
    q = torch.randn(9, 64, generator=torch.Generator().manual_seed(1))
    plan = kernel.plan(planes, fmt, 5, n, 9)  # a run that starts at row 5
    assert plan is not None
    for layer in (0, 1):
        _assert_matches_sdpa(kernel(plan, layer, q), fmt, planes, layer, (5, 5 + n), q)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_matches_sdpa_over_scattered_rows(kernel, dtype):
    """A request whose slots are scattered over the pool: the kernel reads rows[i]."""
    fmt = KVFormat.resolve(dtype, torch.float32, torch.float32)
    planes = _planes(fmt, 1, 3, 600, 64, seed=3)
    rows = torch.randperm(600, generator=torch.Generator().manual_seed(4))[:333]
    q = torch.randn(9, 64, generator=torch.Generator().manual_seed(5))
    plan = kernel.plan(planes, fmt, rows, len(rows), 9)
    assert plan is not None
    _assert_matches_sdpa(kernel(plan, 0, q), fmt, planes, 0, rows, q)


@pytest.mark.parametrize(
    "heads,kvh,hd",
    [
        (8, 2, 128),
        (4, 4, 64),
        (12, 4, 48),
        (6, 3, 40),
    ],  # unrolled path off; hd 48: no bf16 pairs; 40: plain C
)
@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_other_shapes(kernel, heads, kvh, hd, dtype):
    fmt = KVFormat.resolve(dtype, torch.float32, torch.float32)
    planes = _planes(fmt, 1, kvh, 300, hd, seed=hd)
    q = torch.randn(heads, hd, generator=torch.Generator().manual_seed(6))
    plan = kernel.plan(planes, fmt, 0, 300, heads)
    assert plan is not None
    _assert_matches_sdpa(kernel(plan, 0, q), fmt, planes, 0, (0, 300), q)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("peak", [30.0, 300.0])
def test_peaked_heads_agree(kernel, dtype, peak):
    """Scores hundreds apart (a head that attends to a few keys): the far-off keys' weights,
    below exp(-60), count as 0 (they cannot move the float32 sums), and no weight is NaN."""
    fmt = KVFormat.resolve(dtype, torch.float32, torch.float32)
    planes = _planes(fmt, 1, 3, 900, 64, seed=9)
    q = torch.randn(9, 64, generator=torch.Generator().manual_seed(10)) * peak
    plan = kernel.plan(planes, fmt, 0, 900, 9)
    assert plan is not None
    out = kernel(plan, 0, q)
    assert torch.isfinite(out).all()
    _assert_matches_sdpa(out, fmt, planes, 0, (0, 900), q)


def test_bf16_query_takes_the_pair_dot_products_and_agrees(kernel):
    """q exact in bfloat16 (bf16 activations) scores bf16 keys with AVX512-BF16 dot products:
    the same products, summed in another order."""
    fmt = KVFormat.resolve("bfloat16", torch.float32, torch.float32)
    planes = _planes(fmt, 1, 3, 700, 64, seed=7)
    q = torch.randn(9, 64, generator=torch.Generator().manual_seed(8)).bfloat16().float()
    plan = kernel.plan(planes, fmt, 0, 700, 9)
    assert plan is not None
    _assert_matches_sdpa(kernel(plan, 0, q), fmt, planes, 0, (0, 700), q)


@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize("k", [576, 40])  # 40: not a multiple of 16, the plain C loop
def test_int8_linear_matches_float_matmul(kernel, m, k):
    """The quantized models' lm_head at decode: int8 rows times their float32 scales."""
    g = torch.Generator().manual_seed(m * k)
    w = torch.randint(-127, 128, (1000, k), dtype=torch.int8, generator=g)
    scales = torch.rand(1000, generator=g) * 0.01
    x = torch.randn(m, k, generator=g).bfloat16()
    out = kernel.int8_linear(x, w, scales)
    assert out is not None and out.dtype == torch.float32
    torch.testing.assert_close(out, x.float() @ (w.float() * scales[:, None]).T, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("k", [576, 40])
def test_int8_linear_rows_do_not_depend_on_the_rows_beside_them(kernel, k):
    """The exact path's lm_head: a prompt's rows (any count, four at a time) give each row the
    bits it gets alone in a decode step."""
    g = torch.Generator().manual_seed(k)
    w = torch.randint(-127, 128, (1000, k), dtype=torch.int8, generator=g)
    scales = torch.rand(1000, generator=g) * 0.01
    x = torch.randn(23, k, generator=g).bfloat16()
    whole = kernel.int8_linear(x, w, scales)
    assert whole is not None
    for i in (0, 4, 5, 22):
        assert torch.equal(kernel.int8_linear(x[i : i + 1], w, scales), whole[i : i + 1])
    for a, b in ((0, 5), (3, 10), (17, 23)):
        assert torch.equal(kernel.int8_linear(x[a:b], w, scales), whole[a:b])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("scattered", [False, True])
def test_prefill_rows_are_decode_steps_to_the_bit(kernel, dtype, scattered):
    """prefill_attention: each query of a chunk gets exactly what a decode step at its position
    gets (same key parts, same merge), whatever the chunk's first position or length, over
    contiguous or scattered rows, with float32 queries and bf16-exact ones (the pair-dot path)."""
    fmt = KVFormat.resolve(dtype, torch.float32, torch.float32)
    total = 600
    planes = _planes(fmt, 2, 3, total, 64, seed=11)
    g = torch.Generator().manual_seed(12)
    rows = torch.randperm(total, generator=g) if scattered else 0
    q = torch.randn(total, 9, 64, generator=g)
    if dtype == "bfloat16":
        q[::2] = q[::2].bfloat16().float()
    for first, count in ((0, 600), (0, 1), (255, 3), (256, 300), (599, 1)):
        plan = kernel.plan(planes, fmt, rows, first + count, 9)
        assert plan is not None
        out = kernel.prefill(plan, 1, q[first : first + count])
        for i in (0, count // 2, count - 1):
            one = kernel.plan(planes, fmt, rows if scattered else 0, first + i + 1, 9)
            assert one is not None
            p = first + i
            assert torch.equal(kernel(one, 1, q[p]), out[i : i + 1]), (first, count, i)
    _assert_matches_sdpa(
        out[-1:], fmt, planes, 1, rows[:600] if scattered else (0, 600), q[599].reshape(9, 64)
    )


def test_rms_norm_bf16_matches_the_torch_ops_to_the_last_bit_but_rarely(kernel):
    """The decode step's norms on bf16 activations against LlamaModel._rms's ops: the same bf16
    roundings, so only the sum of squares' order differs (torch's vector lanes vs ours), which
    moves an element by a bf16 ulp or two now and then (the weight multiplies after a rounding)."""
    g = torch.Generator().manual_seed(11)
    same = total = 0
    for t in range(50):
        x = (torch.randn(3, 576, generator=g) * (t % 7 + 0.05)).bfloat16()
        w = (torch.rand(576, generator=g) + 0.5).bfloat16()
        ref = F.rms_norm(x.float(), (576,), None, 1e-5).to(torch.bfloat16) * w
        out = kernel.rms_norm_bf16(x, w, 1e-5)
        ulp = (ref.float().abs().view(torch.int32) >> 16).view(torch.int32)  # bf16 exponent+mantissa
        assert ((out.float().abs().view(torch.int32) >> 16) - ulp).abs().max() <= 2  # two roundings
        same += int((out == ref).sum())
        total += out.numel()
    assert same / total > 0.999


def test_loading_leaves_denormals_alone(kernel):
    """Built with -ffast-math but linked without it: loading must not switch the process to
    flush-to-zero (GCC links crtfastmath.o into -shared -ffast-math libraries)."""
    assert (torch.tensor([1e-40]) * 1).item() != 0.0


def test_plan_refuses_layouts_it_cannot_read(kernel):
    fmt = KVFormat.resolve("float32", torch.float32, torch.float32)
    planes = _planes(fmt, 1, 3, 32, 64, seed=9)
    assert kernel.plan(planes, fmt, 0, 32, 10) is None  # 10 query heads over 3 kv heads
    strided = tuple(p.transpose(2, 3) for p in planes)
    assert kernel.plan(strided, fmt, 0, 32, 9) is None


def test_no_compiler_is_a_typed_error_and_the_default_falls_back(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    monkeypatch.setenv("RADIXAGENT_KERNEL_DIR", str(tmp_path))
    with pytest.raises(KernelUnavailable, match="no C compiler"):
        DecodeKernel.load()
    model = _FakeModel()
    assert decode_kernel(EngineConfig(), model) is None  # default: torch_native, with a warning
    with pytest.raises(ValueError, match="attention_backend native_cpu: no C compiler"):
        decode_kernel(EngineConfig(attention_backend="native_cpu"), model)


def test_config_names_the_bad_backend():
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        EngineConfig(attention_backend="flashinfer")
    assert decode_kernel(EngineConfig(attention_backend="torch_native"), _FakeModel()) is None


class _FakeModel:
    """decode_kernel only asks whether the model is the HF fallback."""


def test_engine_decodes_with_the_kernel_and_agrees_with_torch_native(engine):
    """The real model: the default engine runs native_cpu; a torch_native sibling over the same
    weights gives the same greedy tokens, and one decode step's logits agree closely."""
    from runtime.cache.seq_kv import SeqKV
    from runtime.model.model import Segment

    assert engine.attention_backend == "native_cpu"
    assert engine.get_cache_stats()["attention_backend"] == "native_cpu"
    plain = engine.sibling(attention_backend="torch_native", max_total_tokens=2048)
    try:
        assert plain.attention_backend == "torch_native"
        prompt = engine.apply_chat_template(
            [{"role": "user", "content": "Name three colours of the rainbow."}]
        )
        params = {"temperature": 0, "max_new_tokens": 24}
        ours = engine.generate(prompt, sampling_params=params)["output_ids"]
        assert plain.generate(prompt, sampling_params=params)["output_ids"] == ours
    finally:
        plain.shutdown()
    model, kernel = engine.model, engine.scheduler.decode_kernel
    ids = engine.tokenize("The quick brown fox jumps over the lazy dog. " * 30)
    for dtype in ("bfloat16", "int8"):
        fmt = KVFormat.resolve(dtype, model.dtype, model.kv_dtype)
        logits = []
        for k in (kernel, None):
            kv = SeqKV.empty(model.cfg, len(ids) + 4, fmt, "cpu")
            model.forward([Segment(kv, ids[:-1])])
            logits.append(model.forward([Segment(kv, ids[-1:])], decode_kernel=k)[0])
        torch.testing.assert_close(logits[0], logits[1], atol=2e-3, rtol=1e-3)
        assert logits[0].argmax() == logits[1].argmax()


def _decode_steps(model, kernel, fmt: KVFormat, fused: bool, scattered: bool, monkeypatch):
    """Two requests prefilled, then 6 decode steps together; returns (logits, tokens, planes)."""
    import runtime.model.model as model_module
    from runtime.cache.seq_kv import SeqKV
    from runtime.model.decode_kernel import DecodePlans
    from runtime.model.model import Segment

    monkeypatch.setattr(model_module, "DecodePlans", DecodePlans if fused else _NoPlans)
    kvs = [SeqKV.empty(model.cfg, 200, fmt, "cpu") for _ in range(2)]
    if scattered:  # the second request's positions spread over a pool-like buffer, out of order
        pool = SeqKV.empty(model.cfg, 400, fmt, "cpu")
        kvs[1] = SeqKV(pool.k, pool.v, fmt=fmt, scales=pool.scales, slots=list(range(399, 199, -1)))
    model.forward([Segment(kvs[0], list(range(300, 420)))])
    model.forward([Segment(kvs[1], list(range(600, 650)))])
    tokens, logits = [[11, 13]], []
    for _ in range(6):
        out = model.forward(
            [Segment(kv, [t]) for kv, t in zip(kvs, tokens[-1], strict=True)], decode_kernel=kernel
        )
        logits.append(out)
        tokens.append(out.argmax(-1).tolist())
    return torch.stack(logits), tokens, [p.clone() for kv in kvs for p in kv.planes]


class _NoPlans:
    @staticmethod
    def of(plans, act):
        return None


@pytest.mark.parametrize("scattered", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "int8"])
def test_fused_decode_layer_is_the_torch_ops_to_the_bit(
    kernel, engine, int4_engine, dtype, scattered, monkeypatch
):
    """rope, the K/V store (int8: its scale and levels) and attention in one native call give the
    same logits, tokens and stored K/V bits as the torch ops they replace, for the float32 model
    and the int4wo-32 (bf16) one, rows in one run or scattered."""
    for model in (engine.model, int4_engine.model):
        fmt = KVFormat.resolve(dtype, model.dtype, model.kv_dtype)
        fused = _decode_steps(model, kernel, fmt, True, scattered, monkeypatch)
        plain = _decode_steps(model, kernel, fmt, False, scattered, monkeypatch)
        assert torch.equal(fused[0], plain[0])
        assert fused[1] == plain[1]
        assert all(torch.equal(a, b) for a, b in zip(fused[2], plain[2], strict=True))


def test_fused_decode_layer_rejects_rows_that_do_not_match_its_plans(kernel):
    from runtime.model.decode_kernel import DecodePlans

    fmt = KVFormat.resolve("bfloat16", torch.bfloat16, torch.float32)
    planes = _planes(fmt, 2, 3, 64, 64, seed=1)
    plan = kernel.plan(planes, fmt, 0, 10, 9)
    assert plan is not None
    plans = DecodePlans.of([plan], torch.bfloat16)
    assert plans is not None and DecodePlans.of([plan], torch.float16) is None
    h = torch.zeros(2, 9 * 64 + 2 * 3 * 64, dtype=torch.bfloat16)
    rows = torch.zeros(2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="2 rows"):
        kernel.layer_step(plans, 0, h, rows, rows)


def test_silu_mul_is_torchs_bits_for_every_bf16_gate(kernel):
    """The native silu(gate) * up (torch's own vectorised exp) equals torch's ops for all finite
    bf16 gates, on decode-sized rows; other dtypes go to the torch ops."""
    from runtime.model.decode_kernel import silu_mul

    assert kernel.silu_fn is not None  # the load-time check passed on this machine
    gate = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    gate = gate[torch.isfinite(gate)]
    gate = torch.cat([gate, gate.new_zeros(43 * 1536 - gate.numel())]).view(43, 1536)  # the MLP's width
    up = torch.randn(gate.shape, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    for rows in (slice(0, 1), slice(1, 4), *(slice(i, i + 13) for i in range(4, 43, 13))):
        h = torch.cat([gate[rows], up[rows]], dim=1)
        assert torch.equal(kernel.silu_mul(h), silu_mul(h))
    h32 = torch.randn(2, 64)
    assert torch.equal(kernel.silu_mul(h32), silu_mul(h32))


@pytest.mark.parametrize("n,k", [(960, 576), (3072, 576), (576, 1536), (37, 50)])
def test_linear_f32_rows_do_not_depend_on_the_rows_beside_them(kernel, n, k):
    """Deterministic inference's float32 matmul: every row the same bits for any row count and
    position (MKL's sgemm changes with both on some CPUs), within float32 rounding of F.linear."""
    g = torch.Generator().manual_seed(n)
    x, w, b = torch.randn(170, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    whole = kernel.linear_f32(x, w, b)
    torch.testing.assert_close(whole, F.linear(x, w, b), atol=1e-4, rtol=1e-4)
    for start, m in ((0, 1), (3, 1), (0, 3), (5, 4), (0, 15), (7, 64), (0, 100), (20, 150)):
        assert torch.equal(kernel.linear_f32(x[start : start + m], w, b), whole[start : start + m]), (
            start,
            m,
        )
    assert torch.equal(kernel.linear_f32(x[:9], w, None) + b, whole[:9])  # the bias is added last


def test_linear_f32_refuses_other_dtypes(kernel):
    with pytest.raises(ValueError, match="linear_f32"):
        kernel.linear_f32(torch.ones(2, 16, dtype=torch.bfloat16), torch.ones(4, 16), None)


@pytest.mark.parametrize("m", [1, 5, 16, 23])
def test_int8_head_on_bf16_rows_is_row_invariant_in_every_block(kernel, m):
    """bf16 rows take the pair-dot-product head where the CPU has AVX512-BF16 (blocks of up to 8
    rows, 4 or 2 outputs, a one-output tail: 1001 outputs): each row the bits it gets alone, and
    the bits of the float32 rows' kernel."""
    g = torch.Generator().manual_seed(m)
    w = torch.randint(-127, 128, (1001, 576), dtype=torch.int8, generator=g)
    scales = torch.rand(1001, generator=g) * 0.01
    x = torch.randn(m, 576, generator=g).bfloat16()
    out = kernel.int8_linear(x, w, scales)
    assert out is not None
    for i in range(m):  # one or two rows take the FMA kernel, more the pair dot products
        assert torch.equal(kernel.int8_linear(x[i : i + 1], w, scales), out[i : i + 1])
        assert torch.equal(kernel.int8_linear(x[i : i + 2], w, scales), out[i : i + 2])
    # the float32 rows' kernel sums in the same order: the logits are the bits they were before
    assert torch.equal(out, kernel.int8_linear(x.float(), w, scales))
    torch.testing.assert_close(
        out.double(), x.double() @ (w.double() * scales.double()[:, None]).T, atol=1e-5, rtol=1e-5
    )


def test_int8_head_takes_inputs_below_2e_minus_100_as_zero(kernel):
    """Denormal and tiny bf16 inputs: the pair dot products flush denormals and FMAs do not, so
    both kernels take |x| < 2^-100 as 0 and agree on every row count."""
    g = torch.Generator().manual_seed(5)
    w = torch.randint(-127, 128, (256, 64), dtype=torch.int8, generator=g)
    scales = torch.ones(256)
    x = torch.randn(9, 64, generator=g).bfloat16()
    x[:, :8] = torch.tensor([1e-39, -3e-40, 2**-101, -(2**-110), 2**-99, 1e-38, 0.0, -0.0]).bfloat16()
    out = kernel.int8_linear(x, w, scales)
    assert out is not None
    for i in range(9):
        assert torch.equal(kernel.int8_linear(x[i : i + 1], w, scales), out[i : i + 1])
    flushed = x.clone()
    flushed[:, :4] = 0
    assert torch.equal(kernel.int8_linear(flushed, w, scales), out)
    # a row of 2^-99 is kept, one of 2^-101 is zero
    rows = torch.tensor([[2.0**-99] * 64, [2.0**-101] * 64]).bfloat16()
    kept, zero = kernel.int8_linear(rows, w, scales)
    assert kept.abs().max() > 0 and zero.abs().max() == 0


@pytest.mark.parametrize("n", [1, 5, 15, 16, 17, 31, 32, 33, 49152])
def test_argmax_is_torchs_pick_on_random_rows(kernel, n):
    x = torch.randn(7, n, generator=torch.Generator().manual_seed(n))
    assert kernel.argmax(x) == x.argmax(dim=-1).tolist()


def _row(n: int, fill: float, at: dict[int, float]) -> torch.Tensor:
    x = torch.full((n,), fill)
    for i, v in at.items():
        x[i] = v
    return x


@pytest.mark.parametrize(
    "n, fill, at",
    [
        (40, 0.0, {3: 1.0, 20: 1.0, 39: 1.0}),  # ties: the first
        (40, 0.0, {35: 2.0, 38: 2.0}),  # ties in the tail only
        (40, 0.0, {7: float("nan"), 2: 5.0}),  # a NaN wins over every value
        (40, 0.0, {38: float("nan"), 39: float("nan"), 1: float("inf")}),  # the first NaN, in the tail
        (16, 0.0, {15: float("nan")}),
        (40, float("-inf"), {}),  # all -inf: index 0
        (9, float("-inf"), {}),
        (40, -1.0, {10: float("inf"), 12: float("inf")}),
        (40, -1.0, {4: -0.0, 6: 0.0}),  # -0 == +0: the first
        (40, -1.0, {4: 0.0, 6: -0.0}),
        (33, -3.0, {32: -2.0}),  # the largest is the last entry, alone in the tail
    ],
)
def test_argmax_is_torchs_pick_on_ties_nans_and_infinities(kernel, n, fill, at):
    x = _row(n, fill, at)
    rows = torch.stack([x, x.flip(0), torch.randn(n, generator=torch.Generator().manual_seed(1))])
    assert kernel.argmax(rows) == rows.argmax(dim=-1).tolist()


def test_argmax_reads_strided_rows_and_falls_back_on_other_dtypes(kernel):
    wide = torch.randn(5, 100, generator=torch.Generator().manual_seed(2))
    wide[:, 60:] = 1e9  # past the view's columns: must not be read
    view = wide[:, :60]
    assert view.stride(0) == 100 and kernel.argmax(view) == view.argmax(dim=-1).tolist()
    assert kernel.argmax(view.double()) == view.argmax(dim=-1).tolist()
    assert kernel.argmax(view.t().contiguous().t()) == view.argmax(dim=-1).tolist()  # column-major
    assert kernel.argmax(torch.empty(0, 49152)) == []


def test_argmax_without_avx512_is_torchs_pick_too(tmp_path):
    """The portable path (CPUs without AVX-512F build it): the same cases, built with AVX-512 off."""
    import ctypes
    import shutil
    import subprocess
    from pathlib import Path

    from runtime.model.decode_kernel import FLAGS, compiler

    cc = compiler()
    if shutil.which(cc) is None:
        pytest.skip("no C compiler")
    src = Path(__file__).parents[2] / "runtime" / "model" / "csrc" / "argmax.c"
    lib_path = tmp_path / "argmax.so"
    flags = [f for f in FLAGS if f != "-march=native"] + ["-mno-avx512f", "-shared"]
    subprocess.run([cc, *flags, "-o", str(lib_path), str(src)], check=True, capture_output=True)
    fn = ctypes.CDLL(str(lib_path)).argmax_rows
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    nan, inf = float("nan"), float("inf")
    rows = [torch.randn(3, n, generator=torch.Generator().manual_seed(n)) for n in (1, 15, 17, 49152)]
    rows += [
        torch.tensor([r], dtype=torch.float32)
        for r in ([0, 1, 1, 0], [0, nan, 5, nan], [-inf, -inf], [-1, -0.0, 0.0], [1, inf, inf, nan], [nan])
    ]
    for x in rows:
        out = torch.empty(x.shape[0], dtype=torch.int64)
        assert fn(x.data_ptr(), x.shape[0], x.shape[1], x.stride(0), out.data_ptr()) == 0
        assert out.tolist() == x.argmax(dim=-1).tolist()
