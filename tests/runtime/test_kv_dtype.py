"""`kv_cache_dtype`: sizes, refusals, quantize-on-write independent of chunking, and greedy
outputs identical cached vs uncached and batched vs alone for every KV format (real model)."""

from __future__ import annotations

import pytest
import torch

from runtime.cache.kv_format import KVFormat, kv_cache_dtype_problems
from runtime.cache.kv_pool import KVPool
from runtime.cache.seq_kv import SeqKV
from runtime.config import EngineConfig
from runtime.model.model import LlamaModel, Segment
from tests.runtime.conftest import chat
from tests.runtime.test_forward import TINY

FORMATS = ("float32", "bfloat16", "float16", "int8")
GREEDY = {"temperature": 0, "max_new_tokens": 8}


def fmt(name: str, model_dtype: torch.dtype = torch.float32) -> KVFormat:
    return KVFormat.resolve(name, model_dtype, torch.float32)


def test_bytes_per_token_follow_the_format():
    shape = (30, 3, 64)  # SmolLM2-135M: layers, kv heads, head dim
    assert fmt("float32").bytes_per_token(*shape) == 46080
    assert fmt("bfloat16").bytes_per_token(*shape) == fmt("float16").bytes_per_token(*shape) == 23040
    assert fmt("int8").bytes_per_token(*shape) == 2 * 30 * 3 * (64 + 4)  # levels + one float32 scale per head
    assert KVPool(64, *shape[:2], 64, fmt("int8"), "cpu").capacity_bytes == 64 * 12240


def test_auto_is_the_model_dtype_and_aliases_resolve():
    assert fmt("auto").name == "float32" and not fmt("auto").converts
    assert fmt("auto", torch.bfloat16).name == "bfloat16" and fmt("auto", torch.bfloat16).converts
    assert EngineConfig(kv_cache_dtype="bf16").kv_cache_dtype == "bfloat16"
    assert EngineConfig(kv_cache_dtype="fp16").kv_cache_dtype == "float16"


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2", "int4", "float64", ""])
def test_unsupported_kv_cache_dtypes_are_refused_by_name(name):
    (problem,) = kv_cache_dtype_problems(name)
    assert "kv_cache_dtype" in problem
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineConfig(kv_cache_dtype=name)
    if name.startswith("fp8"):
        assert "int8" in problem  # says what to use instead


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("src_dtype", [torch.float32, torch.bfloat16])
def test_a_tokens_stored_kv_does_not_depend_on_its_chunk(name, src_dtype):
    """Quantize-on-write is per token: one 300-token chunk, uneven chunks and one token at a
    time store the same bytes (else a cached prefix would differ from a cold run's)."""
    f = fmt(name)
    g = torch.Generator().manual_seed(7)
    k = (torch.randn(3, 300, 64, generator=g) * 4).to(src_dtype)
    v = torch.randn(3, 300, 64, generator=g).to(src_dtype)
    k[1, 5] = 0  # an all-zero row must not divide by zero

    def stored(cuts: list[int]) -> tuple[torch.Tensor, ...]:
        planes = f.alloc(1, 3, 300, 64, "cpu", zeros=True)
        for a, b in zip(cuts, cuts[1:], strict=False):
            f.store(tuple(p[0, :, a:b] for p in planes), k[:, a:b], v[:, a:b])
        return planes

    whole = stored([0, 300])
    for cuts in ([0, 1, 8, 300], list(range(301)), [0, 150, 299, 300]):
        assert all(torch.equal(a, b) for a, b in zip(whole, stored(cuts), strict=True))
    k_out, v_out = torch.empty(3, 300, 64), torch.empty(3, 300, 64)
    f.load(tuple(p[0] for p in whole), k_out, v_out)
    assert torch.isfinite(k_out).all() and (k_out[1, 5] == 0).all()
    # error bound of the format: exact (float32, or bf16 into bf16), half an ulp, or half a level
    bound = {"float32": 0.0, "bfloat16": 2**-8, "float16": 2**-11, "int8": None}[name]
    if bound is None:
        step = k.float().abs().amax(-1, keepdim=True) / 127
        assert ((k_out - k.float()).abs() <= step / 2 * (1 + 1e-4)).all()
    elif src_dtype == torch.bfloat16 and name != "float16":
        assert torch.equal(k_out, k.float())
    else:
        assert ((k_out - k.float()).abs() <= k.float().abs() * bound).all()


@pytest.mark.parametrize("name", ["bfloat16", "int8"])
def test_pool_round_trip_moves_every_plane(name):
    f = fmt(name)
    pool = KVPool(32, 2, 3, 64, f, "cpu")
    planes = f.alloc(2, 3, 8, 64, "cpu")
    kv = SeqKV(planes[0], planes[1], list(range(8)), fmt=f, scales=planes[2:])
    g = torch.Generator().manual_seed(3)
    for layer in range(2):
        f.store(
            tuple(p[layer, :, :8] for p in kv.planes),
            torch.randn(3, 8, 64, generator=g),
            torch.randn(3, 8, 64, generator=g),
        )
    slots = pool.alloc(8)
    pool.write(slots, kv.span(0, 8))
    idx = torch.tensor(slots)
    assert len(kv.planes) == (4 if name == "int8" else 2)
    assert all(torch.equal(a, p.index_select(2, idx)) for a, p in zip(kv.planes, pool.planes, strict=True))


@pytest.mark.parametrize("name", FORMATS)
def test_forward_prefix_then_suffix_matches_one_chunk_for_every_format(name):
    """A random tiny model: the last token's logits after [prefix] + [suffix] steps equal those
    of one cold chunk, and stay close to float32 KV (the format only rounds K/V)."""
    model = LlamaModel.random(TINY, torch.float32, "cpu", seed=1)
    f = KVFormat.resolve(name, model.dtype, model.kv_dtype)
    ids = torch.randint(0, TINY.vocab_size, (90,), generator=torch.Generator().manual_seed(2)).tolist()

    def run(cuts: list[int], f: KVFormat) -> torch.Tensor:
        kv = SeqKV.empty(TINY, len(ids), f, "cpu")
        for a, b in zip(cuts, cuts[1:], strict=False):
            logits = model.forward([Segment(kv, ids[a:b])])
        return logits[0]

    cold = run([0, 90], f)
    assert torch.allclose(run([0, 60, 89, 90], f), cold, atol=1e-4)
    assert torch.allclose(cold, run([0, 90], fmt("float32")), atol=5e-3)


# ---- the real model --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def short_document(document) -> str:
    return document[:700]  # ~150 tokens: small prompts, a real shared prefix


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,deterministic",
    [
        ("bfloat16", False),
        ("float16", False),
        # int8 rounds each K/V value to one of 255 levels, so a last-bit difference between a
        # prefill of many rows and of one (MKL's sgemm blocking on an Intel Xeon) can move a level
        # and the greedy tokens: the guarantee for every format is deterministic inference's
        ("bfloat16", True),
        ("int8", True),
    ],
)
def test_greedy_cached_equals_uncached_and_batched_equals_alone(engine, short_document, name, deterministic):
    flags = {
        "kv_cache_dtype": name,
        "max_total_tokens": 4096,
        "enable_deterministic_inference": deterministic,
    }
    cached = engine.sibling(**flags)
    uncached = engine.sibling(**flags, disable_radix_cache=True)
    prompts = [
        chat(engine, short_document, q) for q in ("What is this text about?", "Who is mentioned first?")
    ]
    try:
        assert cached.get_cache_stats()["kv_cache_dtype"] == name
        first = [cached.generate(p, sampling_params=GREEDY) for p in prompts]
        again = cached.generate(prompts[0], sampling_params=GREEDY)
        batched = uncached.generate(prompts, sampling_params=GREEDY)
        cached.check_integrity()
    finally:
        cached.shutdown()
        uncached.shutdown()
    assert first[1]["meta_info"]["cached_tokens"] > 100  # the document, computed by the first question
    assert again["meta_info"]["cached_tokens"] == len(engine.tokenize(prompts[0])) - 1
    assert again["output_ids"] == first[0]["output_ids"]
    for alone, together in zip(first, batched, strict=True):
        assert alone["output_ids"] == together["output_ids"]
    assert first[0]["text"].strip()


@pytest.mark.slow
def test_int8_pool_holds_3_8x_the_tokens_of_float32_in_the_same_bytes(engine):
    budget = 4096 * engine.kv_bytes_per_token
    small = engine.sibling(kv_cache_dtype="int8", max_total_tokens=budget // 12240)
    try:
        assert small.get_cache_stats()["pool_capacity_bytes"] <= budget
        assert small.pool.size / 4096 > 3.7
    finally:
        small.shutdown()


def test_the_hf_fallback_refuses_formats_it_cannot_store():
    from runtime.engine.build import kv_format
    from runtime.model.hf_model import HFModel

    fake = object.__new__(HFModel)
    fake.dtype, fake.kv_dtype, fake.cfg = torch.float32, torch.float32, TINY
    with pytest.raises(ValueError, match="compact forward"):
        kv_format(EngineConfig(kv_cache_dtype="int8"), fake)
    assert kv_format(EngineConfig(), fake).name == "float32"  # auto: the fallback's own dtype
