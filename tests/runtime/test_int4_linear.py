"""The native int4 matmul (runtime/model/csrc/int4_linear.c, quant.py's Int4Tiles): the exact
fast path's matmul, so each row must be the same bits whatever rows share the call."""

from __future__ import annotations

import pytest
import torch

from runtime.model.decode_kernel import DecodeKernel
from runtime.model.quant import Int4, Int4Tiles, QuantizationError, WeightFormat, int4_levels


@pytest.fixture(scope="module")
def kernel() -> DecodeKernel:
    k = DecodeKernel.load()
    if k.int4_fn is None:
        pytest.skip("this CPU has no AVX512-BF16: the engine keeps torch's int4 matmul")
    return k


def _layer(kernel: DecodeKernel, n: int, k: int, group: int, seed: int = 0) -> tuple[Int4Tiles, torch.Tensor]:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05
    q, scale, zero = int4_levels(w, group, torch.bfloat16)
    deq = (q.float().view(n, -1, group) - 8) * scale.float()[..., None] + zero.float()[..., None]
    return Int4Tiles.quantize(w, group, torch.bfloat16, None, kernel), deq.view(n, k)


@pytest.mark.parametrize(
    ("n", "k", "group"),
    [(960, 576, 32), (576, 1536, 32), (80, 96, 32), (208, 256, 64), (48, 512, 128), (16, 32, 32)],
)
def test_matches_the_dequantized_matmul(kernel, n, k, group):
    layer, deq = _layer(kernel, n, k, group)
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    ref = x.float() @ deq.t()
    got = layer(x)
    assert got.dtype == torch.bfloat16 and got.shape == (9, n)
    # bf16 outputs: within a rounding of the largest values (and far under the weights' own error)
    assert (got.float() - ref).abs().max() <= ref.abs().max() * 2**-7


@pytest.mark.parametrize(("n", "k"), [(960, 576), (3072, 576), (576, 1536), (80, 96)])
def test_rows_do_not_depend_on_the_rows_beside_them(kernel, n, k):
    layer, _ = _layer(kernel, n, k, 32, seed=2)
    x = torch.randn(37, k, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16) * 3
    whole = layer(x).view(torch.int16)
    threads = torch.get_num_threads()
    try:
        for t in sorted({1, threads}):
            torch.set_num_threads(t)
            for m in (1, 2, 3, 4, 5, 8, 17, 36):
                assert torch.equal(layer(x[:m]).view(torch.int16), whole[:m]), (t, m)
                assert torch.equal(layer(x[m : m + 1]).view(torch.int16), whole[m : m + 1]), (t, m)
                assert torch.equal(layer(x[m:]).view(torch.int16), whole[m:]), (t, m)
    finally:
        torch.set_num_threads(threads)


def test_agrees_with_torchs_int4_kernel_on_the_same_levels(kernel):
    w = torch.randn(576, 576, generator=torch.Generator().manual_seed(4)) * 0.05
    ours = Int4Tiles.quantize(w, 32, torch.bfloat16, None, kernel)
    theirs = Int4.quantize(w, 32, torch.bfloat16, None)
    x = torch.randn(5, 576, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    a, b = ours(x).float(), theirs(x).float()
    assert (a - b).abs().max() <= b.abs().max() * 2**-7  # the same weights, sums in another order
    assert ours.nbytes < theirs.nbytes * 1.01  # no second copy of the weights


def test_bias_is_added(kernel):
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(6))
    bias = torch.randn(32, generator=torch.Generator().manual_seed(7))
    with_bias = Int4Tiles.quantize(w, 32, torch.bfloat16, bias, kernel)
    without = Int4Tiles.quantize(w, 32, torch.bfloat16, None, kernel)
    x = torch.randn(3, 64).to(torch.bfloat16)
    assert torch.equal(with_bias(x), without(x) + bias.to(torch.bfloat16))


def test_refuses_what_it_cannot_compute(kernel):
    layer, _ = _layer(kernel, 32, 64, 32)
    with pytest.raises(ValueError, match="int4_linear"):
        kernel.int4_linear(torch.randn(2, 64), layer.tiles, layer.scales_zeros, 32)  # float32 rows
    with pytest.raises(ValueError, match="int4_linear"):
        kernel.int4_linear(torch.randn(2, 96).to(torch.bfloat16), layer.tiles, layer.scales_zeros, 32)


def test_weight_format_takes_the_tiles_where_it_can(kernel):
    fmt = WeightFormat(torch.bfloat16, "cpu", "int4wo-32", kernel)
    assert isinstance(fmt.linear(torch.randn(64, 64)), Int4Tiles)
    with pytest.raises(QuantizationError, match="divisible by 16"):  # outputs not in tiles of 16
        fmt.linear(torch.randn(40, 64))
    assert isinstance(WeightFormat(torch.bfloat16, "cpu", "int4wo-32").linear(torch.randn(64, 64)), Int4)


def test_the_default_engine_runs_the_tiles(kernel, int4_engine):
    assert isinstance(int4_engine.model.layers[0].qkv, Int4Tiles)


def test_one_call_decode_layers_are_the_separate_calls_to_the_bit(kernel, int4_engine, monkeypatch):
    """A decode step of the int4 model runs each layer as one native call (csrc/decode_step.c):
    its logits and K/V equal those of the same token inside a prompt chunk (the separate calls)."""
    from runtime.cache.kv_format import KVFormat
    from runtime.cache.seq_kv import SeqKV
    from runtime.model.model import Segment

    model = int4_engine.model
    assert model._int4_layers is not None
    calls = []
    real = DecodeKernel.int4_layer
    monkeypatch.setattr(DecodeKernel, "int4_layer", lambda self, *a: calls.append(a[1]) or real(self, *a))
    dk = int4_engine.scheduler.decode_kernel
    ids = int4_engine.tokenize("The quick brown fox jumps over the lazy dog because it")
    for fmt in (
        KVFormat.resolve("bfloat16", model.dtype, model.kv_dtype),
        KVFormat.resolve("int8", model.dtype, model.kv_dtype),
    ):
        chunk = SeqKV.empty(model.cfg, len(ids), fmt, "cpu")
        whole = model.forward([Segment(chunk, ids, logits_from=0)], decode_kernel=dk)
        steps = SeqKV.empty(model.cfg, len(ids), fmt, "cpu")
        model.forward([Segment(steps, ids[:-3])], decode_kernel=dk)
        calls.clear()
        for i in range(len(ids) - 3, len(ids)):
            last = model.forward([Segment(steps, [ids[i]])], decode_kernel=dk)
        assert len(calls) == 3 * model.cfg.layers  # the one-call path ran
        assert torch.equal(last[0], whole[0])
        n = len(ids)
        for a, b in zip(chunk.planes, steps.planes, strict=True):  # [layers, kv heads, rows, x]
            assert torch.equal(a[:, :, :n], b[:, :, :n])
