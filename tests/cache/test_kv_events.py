"""KV events over a real radix tree and a real ZMQ socket (no model): SGLang 0.5.23's hashes,
pages over the token-level tree, stores / removals / clears, the replay endpoint, the bounded
queue."""

from __future__ import annotations

import random
import time

import pytest

zmq = pytest.importorskip("zmq")
pytest.importorskip("msgspec")

from runtime.cache.kv_events.config import parse_kv_events_config  # noqa: E402
from runtime.cache.kv_events.hashing import prompt_block_hashes  # noqa: E402
from runtime.cache.kv_events.publisher import start_publisher  # noqa: E402
from runtime.cache.kv_events.recorder import KVEventRecorder  # noqa: E402
from runtime.cache.kv_events.schema import (  # noqa: E402
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    decoder,
)
from runtime.cache.kv_pool import SlotAllocator  # noqa: E402
from runtime.cache.manager import RadixCacheManager  # noqa: E402
from runtime.cache.namespace import namespace_key  # noqa: E402
from runtime.cache.policies import make_policy  # noqa: E402
from runtime.cache.radix import RadixCache  # noqa: E402


def test_hashes_match_sglang_native_hash() -> None:
    """Golden values from SGLang 0.5.23's own hash extension (mem_cache/cpp_utils/hash_binding.cpp,
    compiled from the wheel and run on tokens 1..8 at page size 4, then with the salt root of
    "tenant-a", then one page holding an id over 2**32 at page size 1)."""
    toks = list(range(1, 9))
    assert prompt_block_hashes(toks, 4) == [-3488128144981237669, 5674439469042975057]
    assert prompt_block_hashes(toks, 4, "tenant-a") == [3718046898735569995, 3308615664605479373]
    assert prompt_block_hashes([3, 2**40], 1) == [-7088902186341056926, -516486108260650015]
    assert prompt_block_hashes(toks[:7], 4) == prompt_block_hashes(toks, 4)[:1]  # whole pages only


def test_config_honours_or_refuses_each_field() -> None:
    assert parse_kv_events_config(None) is None
    assert parse_kv_events_config('{"publisher": "null"}') is None
    cfg = parse_kv_events_config('{"publisher":"zmq","endpoint":"tcp://*:5557","topic":"kv-events"}')
    assert cfg is not None and cfg.binds() and cfg.topic == "kv-events"
    assert not parse_kv_events_config('{"publisher":"zmq","endpoint":"tcp://10.0.0.1:5557"}').binds()  # type: ignore[union-attr]
    for bad, field in (
        ('{"publisher":"zmq","page_size":4}', "page_size"),
        ('{"publisher":"kafka"}', "publisher"),
        ('{"publisher":"zmq","hwm":"many"}', "hwm"),
        ('{"publisher":"zmq","buffer_steps":0}', "buffer_steps"),
        ('{"publisher":"zmq","format":"vllm"}', "format"),
        ('{"publisher":"zmq","endpoint":"http://x"}', "endpoint"),
    ):
        with pytest.raises(ValueError, match=field):
            parse_kv_events_config(bad)


class Harness:
    """A tree with a publisher on a loopback port and a subscriber on it."""

    def __init__(self, block_size: int, pool: int = 64, **extra: object) -> None:
        raw = {"publisher": "zmq", "endpoint": "tcp://127.0.0.1:0", "bind": True, "topic": "kv", **extra}
        import json

        config = parse_kv_events_config(json.dumps(raw))
        assert config is not None
        self.tree = RadixCache(SlotAllocator(pool), make_policy("lru"))
        self.pub = start_publisher(config, block_size, self.tree.roots)
        self.tree.observer = self.pub.recorder
        self.manager = RadixCacheManager(self.tree)
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"kv")
        self.sub.connect(self.pub.bound_endpoint())
        self.decode = decoder()
        time.sleep(0.3)  # PUB/SUB: a subscription takes a moment to reach the publisher

    def put(self, key: list[int], salt: str | None = None, session: str | None = None) -> None:
        ns = namespace_key(salt)
        self.pub.recorder.name(ns, salt, None)
        lease = self.manager.start(key, len(key), ns, session_id=session)
        self.manager.release(lease, key, len(key), insert=True)

    def events(self, want: int = 1, timeout_s: float = 5.0) -> list:
        out: list = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(out) < want:
            if self.sub.poll(100):
                topic, seq, payload = self.sub.recv_multipart()
                assert topic == b"kv" and len(seq) == 8
                batch = self.decode.decode(payload)
                assert batch.attn_dp_rank == 0 and batch.ts > 0
                out.extend(batch.events)
        return out

    def close(self) -> None:
        self.sub.close(linger=0)
        self.ctx.term()
        self.pub.close()


@pytest.fixture
def harness():
    made: list[Harness] = []

    def make(block_size: int, **kw: object) -> Harness:
        made.append(Harness(block_size, **kw))
        return made[-1]

    yield make
    for h in made:
        h.close()


def _stored(events: list) -> list[int]:
    return [h for e in events if isinstance(e, BlockStored) for h in e.block_hashes]


def test_store_remove_clear_over_pages(harness) -> None:
    h = harness(4, pool=24)
    prompt = list(range(100, 118))  # 18 tokens: 4 whole pages, 2 tokens never announced
    h.put(prompt, session="s1")
    events = h.events()
    assert _stored(events) == prompt_block_hashes(prompt, 4)
    store = events[0]
    assert store.parent_block_hash is None and store.block_size == 4 and store.medium == "GPU"
    assert store.token_ids == prompt[:16] and store.session_id == "s1"
    # a branch off token 6 (inside page 1): pages 1.. of the branch are new, page 0 is shared
    branch = prompt[:6] + [7, 7, 7, 7, 7, 7]
    h.put(branch)
    (ev,) = h.events()
    assert ev.block_hashes == prompt_block_hashes(branch, 4)[1:]
    assert ev.parent_block_hash == prompt_block_hashes(prompt, 4)[0]
    # the pool (24) is full: a third prompt evicts the least recent leaf (the first prompt's tail)
    h.put(list(range(500, 512)))
    evs = h.events(2)
    removed = [x for e in evs if isinstance(e, BlockRemoved) for x in e.block_hashes]
    assert set(removed) == set(prompt_block_hashes(prompt, 4)[1:])  # page 0 is still held by the branch
    assert _stored(evs) == prompt_block_hashes(list(range(500, 512)), 4)
    h.tree.reset()
    assert isinstance(h.events()[0], AllBlocksCleared)


def test_salt_changes_hashes_and_is_published(harness) -> None:
    h = harness(1)
    prompt = [1, 2, 3]
    h.put(prompt)
    h.put(prompt, salt="tenant-a")
    plain, salted = h.events(2)
    assert plain.block_hashes == prompt_block_hashes(prompt, 1) and plain.cache_salt is None
    assert salted.block_hashes == prompt_block_hashes(prompt, 1, "tenant-a")
    assert salted.cache_salt == "tenant-a" and not set(salted.block_hashes) & set(plain.block_hashes)


def test_dynamo_format_namespaces_hashes(harness) -> None:
    h = harness(2, format="dynamo")
    prompt = [9, 8, 7, 6]
    h.put(prompt, salt="t")
    (ev,) = h.events()
    assert ev.block_hashes == prompt_block_hashes(prompt, 2, "t", dynamo=True)
    assert ev.block_hashes != prompt_block_hashes(prompt, 2, "t")


def test_replay_endpoint_resends_from_a_sequence(harness) -> None:
    with zmq.Context() as probe:
        s = probe.socket(zmq.ROUTER)
        port = s.bind_to_random_port("tcp://127.0.0.1")
        s.close()
    h = harness(1, replay_endpoint=f"tcp://127.0.0.1:{port}")
    for i in range(3):
        h.put([i + 1, i + 2])
        h.events()
    dealer = h.ctx.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    dealer.send_multipart((b"", (1).to_bytes(8, "big")))
    seqs = []
    while True:
        assert dealer.poll(5000)
        _, topic, seq, payload = dealer.recv_multipart()
        if int.from_bytes(seq, "big", signed=True) == -1:
            break
        assert topic == b"kv" and isinstance(h.decode.decode(payload).events[0], BlockStored)
        seqs.append(int.from_bytes(seq, "big"))
    dealer.close(linger=0)
    assert seqs == [1, 2]


def test_full_queue_drops_and_counts_never_blocks() -> None:
    rec = KVEventRecorder(block_size=1, max_queue=2, roots={})
    started = time.perf_counter()
    for i in range(1000):
        rec.on_insert([i, i + 1], 0, "", None)
    assert time.perf_counter() - started < 0.5
    assert rec.changes.qsize() == 2 and rec.dropped == 998


def test_random_workload_announced_set_tracks_the_tree(harness) -> None:
    """Replaying every event gives exactly the whole pages the tree holds, after inserts,
    splits and evictions in any order."""
    h = harness(3, pool=48)
    rng = random.Random(7)
    held: set[int] = set()
    for _ in range(40):
        base = rng.choice([[1, 2, 3, 4, 5, 6], [1, 2, 9, 9], [4, 4, 4]])
        h.put(base + [rng.randrange(20) for _ in range(rng.randrange(1, 9))])
    for e in h.events(1000, timeout_s=2.0):
        if isinstance(e, BlockStored):
            assert not set(e.block_hashes) & held, "a page announced twice"
            held |= set(e.block_hashes)
        elif isinstance(e, BlockRemoved):
            assert set(e.block_hashes) <= held, "a removal of a page never announced"
            held -= set(e.block_hashes)
    expect: set[int] = set()
    for leaf in h.tree._leaves_set:
        path, cur = [], leaf
        while cur.parent is not None:
            path[:0] = cur.key
            cur = cur.parent
        expect |= set(prompt_block_hashes(path, 3))
    assert held == expect
