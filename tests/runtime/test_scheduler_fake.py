"""The scheduler and the cache manager over a fake model (no weights, milliseconds per test).

The fake model stores each token id as its K and computes the next token from the sum of every
K the request's buffer holds, so a wrong slot, a stale copy or a missed write of cached KV
changes the output. Randomized admit / extend / abort / evict sequences run with
`check_integrity()` (tree, pool, locks, leases, KV budget) after every step, and every request's
greedy output must equal the uncached baseline's.
"""

from __future__ import annotations

import random
import uuid

import pytest
import torch

from runtime.cache.kv_pool import KVPool
from runtime.cache.manager import NoCacheManager, RadixCacheManager
from runtime.cache.policies import make_policy
from runtime.cache.radix import RadixCache
from runtime.cache.request_kv import PooledKV
from runtime.engine.request import Request
from runtime.engine.sampling import Sampler, SamplingParams
from runtime.engine.scheduler import Scheduler
from runtime.model.model import ModelConfig, Segment

VOCAB, EOS = 50, 0
CFG = ModelConfig("llama", VOCAB, 4, 1, 1, 1, 1, 4, 1.0, 1e-6, 4096, True)


class FakeModel:
    """K of a position = its token id; next token = (sum of K so far + length) mod vocab."""

    cfg, device, dtype, kv_dtype = CFG, "cpu", torch.float32, torch.float32

    def exact(self, deterministic: bool, kernel: object) -> bool:
        return deterministic

    def forward(
        self, segments: list[Segment], deterministic: bool = False, decode_kernel=None
    ) -> torch.Tensor:
        rows = []
        for seg in segments:
            m, n = seg.kv.length, len(seg.ids)
            new = torch.tensor(seg.ids, dtype=torch.float32).view(1, n, 1)
            seg.kv.write(0, m, new, new)  # into the request's pool slots
            seg.kv.length += n
            total = int(seg.kv.layer(0, m + n)[0].sum().item()) + m + n
            row = torch.full((VOCAB,), -1.0)
            row[1 + total % (VOCAB - 1)] = 1.0  # never EOS: lengths are set by max_new_tokens
            rows.append(row)
        return torch.stack(rows)


class FakeTokenizer:
    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return " ".join(map(str, ids))


class NoSessions:
    def on_request(self, sid: str) -> None: ...
    def on_request_done(self, sid: str) -> None: ...


def make_scheduler(pool_size: int, cached: bool, policy: str = "lru") -> Scheduler:
    pool = KVPool(pool_size, CFG.layers, CFG.kv_heads, CFG.head_dim, torch.float32, "cpu")
    tree = RadixCache(pool, make_policy(policy))
    manager = (RadixCacheManager if cached else NoCacheManager)(tree, PooledKV(pool))
    return Scheduler(
        FakeModel(),  # type: ignore[arg-type]
        manager,
        FakeTokenizer(),
        eos_ids={EOS},
        max_running=4,
        chunk_size=16,
        sessions=NoSessions(),
    )


def make_request(ids: list[int], max_new: int, prefix_cache: bool = True, ns: str = "") -> Request:
    sp = SamplingParams(max_new_tokens=max_new, temperature=0)
    return Request(uuid.uuid4().hex, ids, sp, ns, prefix_cache, None, 0, Sampler(sp, {EOS}))


def enqueue(sched: Scheduler, req: Request) -> None:
    """What `submit` does, minus the worker thread: the test steps the loop itself."""
    with sched._live_lock:
        sched.live[id(req)] = req
    sched.waiting.append(req)


def step_checked(sched: Scheduler) -> None:
    sched._step()
    sched.manager.check_integrity()
    assert len(sched.manager.leases) == len(sched.running)


def run_all(sched: Scheduler, reqs: list[Request]) -> None:
    for req in reqs:
        enqueue(sched, req)
    for _ in range(10_000):
        if not (sched.waiting or sched.running):
            return
        step_checked(sched)
    raise AssertionError("requests never finished")


def random_prompts(rng: random.Random, n: int) -> list[list[int]]:
    stems = [[rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 40))] for _ in range(4)]
    return [
        rng.choice(stems)[: rng.randint(1, 40)] + [rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 12))]
        for _ in range(n)
    ]


def outputs_uncached(prompts: list[list[int]], max_new: list[int]) -> list[list[int]]:
    sched = make_scheduler(4096, cached=False)
    reqs = [make_request(p, m) for p, m in zip(prompts, max_new, strict=True)]
    run_all(sched, reqs)
    return [r.output_ids for r in reqs]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("policy", ["lru", "lfu", "priority"])
def test_randomized_admit_extend_abort_evict_keeps_every_invariant(seed: int, policy: str) -> None:
    rng = random.Random(seed)
    prompts = random_prompts(rng, 30)
    max_new = [rng.randint(0, 6) for _ in prompts]
    expected = outputs_uncached(prompts, max_new)
    sched = make_scheduler(160, cached=True, policy=policy)  # small: admission waits and evicts
    reqs = [
        make_request(p, m, prefix_cache=rng.random() > 0.15) for p, m in zip(prompts, max_new, strict=True)
    ]
    pending, aborted = list(reqs), set()
    for _ in range(10_000):
        while pending and rng.random() < 0.4:
            enqueue(sched, pending.pop(0))
        if sched.running and rng.random() < 0.05:
            victim = rng.choice(sched.running)
            victim.aborted = True
            aborted.add(id(victim))
        if rng.random() < 0.1:
            sched.manager.evict(rng.randint(1, 30))  # pressure from outside: only unlocked leaves go
            sched.manager.check_integrity()
        if not (pending or sched.waiting or sched.running):
            break
        step_checked(sched)
    assert all(r.done.is_set() for r in reqs)
    for req, want in zip(reqs, expected, strict=True):
        if id(req) not in aborted:
            assert req.output_ids == want, "cached KV changed a greedy output"
    snap = sched.manager.snapshot()
    assert snap.leases == 0 and snap.protected_tokens == 0
    assert snap.pool_free_tokens + snap.tokens_in_use == 160


def test_exact_cached_counts_and_the_uncached_baseline_never_matches() -> None:
    prompt = list(range(1, 21))
    for cached, want in ((True, [0, 19, 19]), (False, [0, 0, 0])):
        sched = make_scheduler(256, cached=cached)
        got = []
        for ids in (prompt, prompt, prompt + [7, 8]):
            req = make_request(ids, 3)
            run_all(sched, [req])
            got.append(req.cached_len)
        assert got[:2] == want[:2]
        if cached:
            assert got[2] == 20  # the whole earlier prompt: published, and the new one is longer
        else:
            assert got[2] == 0 and sched.manager.snapshot().tokens_in_use == 0


def test_per_request_prefix_cache_off_neither_reads_nor_writes() -> None:
    sched = make_scheduler(256, cached=True)
    prompt = list(range(1, 21))
    off = make_request(prompt, 2, prefix_cache=False)
    run_all(sched, [off])
    assert off.cached_len == 0 and sched.manager.snapshot().tokens_in_use == 0
    on = make_request(prompt, 2)
    run_all(sched, [on])
    again = make_request(prompt, 2, prefix_cache=False)
    run_all(sched, [again])
    assert again.cached_len == 0 and again.output_ids == on.output_ids


def test_a_lease_that_cannot_get_slots_holds_nothing() -> None:
    from runtime.errors import PoolExhausted

    sched = make_scheduler(32, cached=True)
    run_all(sched, [make_request(list(range(1, 11)), 2)])
    manager = sched.manager
    other = manager.start(list(range(1, 11)), 20)  # holds its match locked
    with pytest.raises(PoolExhausted):
        manager.start(list(range(30, 50)), 40)
    manager.check_integrity()
    manager.release(other, list(range(1, 11)), 0, insert=False)
    manager.check_integrity()
    assert manager.snapshot().protected_tokens == 0
