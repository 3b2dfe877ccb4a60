"""The embedded engine with the real model: reuse must change timings, never outputs."""

from __future__ import annotations

import threading

import pytest

from runtime.errors import InvalidRequest, PromptTooLong
from tests.runtime.conftest import GREEDY, chat

QUESTIONS = ["What is the main topic?", "Name one person mentioned.", "Summarize the first paragraph."]


def test_document_questions_identical_cached_and_uncached(engine, document):
    system = "Answer from this document.\n\n" + document
    engine.generate(prompt=chat(engine, system, "Warm-up question?"), sampling_params=GREEDY)
    for q in QUESTIONS:
        prompt = chat(engine, system, q)
        uncached = engine.generate(prompt=prompt, sampling_params=GREEDY, prefix_cache=False)
        cached = engine.generate(prompt=prompt, sampling_params=GREEDY)
        assert uncached["meta_info"]["cached_tokens"] == 0
        assert cached["meta_info"]["cached_tokens"] > 1400
        assert cached["output_ids"] == uncached["output_ids"]
    engine.check_integrity()


def test_three_turn_conversation_reuses_prompt_and_output(engine):
    baseline = engine.sibling(disable_radix_cache=True, max_total_tokens=4096)
    try:
        messages = [{"role": "system", "content": "You are a terse assistant."}]
        previous = 0  # tokens of the previous turn's prompt + output whose KV was computed
        for turn in ["Name a fruit.", "What colour is it?", "Name another one."]:
            messages.append({"role": "user", "content": turn})
            prompt = engine.apply_chat_template(messages)
            ids = engine.tokenize(prompt)
            out = engine.generate(input_ids=ids, sampling_params=GREEDY)
            ref = baseline.generate(input_ids=ids, sampling_params=GREEDY)
            assert out["output_ids"] == ref["output_ids"]
            assert ref["meta_info"]["cached_tokens"] == 0
            if previous:  # the earlier turn, including the model's own answer, is served from the cache
                assert out["meta_info"]["cached_tokens"] >= previous
            previous = len(ids) + len(out["output_ids"]) - 1
            messages.append({"role": "assistant", "content": out["text"]})
        baseline.check_integrity()
    finally:
        baseline.shutdown()


def test_cached_tokens_exact_on_token_ids(engine):
    sibling = engine.sibling(max_total_tokens=2048)
    try:
        base = list(range(1000, 1100))
        r1 = sibling.generate(input_ids=base, sampling_params={"temperature": 0, "max_new_tokens": 1})
        assert r1["meta_info"]["cached_tokens"] == 0
        # same prefix, diverging after 60 tokens: exactly 60 hit (and the split keeps the rest)
        r2 = sibling.generate(
            input_ids=base[:60] + list(range(2000, 2040)), sampling_params={"max_new_tokens": 1}
        )
        assert r2["meta_info"]["cached_tokens"] == 60
        # the full first prompt again: everything but the last token (its logits are recomputed)
        r3 = sibling.generate(input_ids=base, sampling_params={"temperature": 0, "max_new_tokens": 1})
        assert r3["meta_info"]["cached_tokens"] == 99
        assert r3["output_ids"] == r1["output_ids"]
        # the first prompt plus its output plus more: prompt + output are in the tree
        longer = base + r1["output_ids"] + [3000, 3001]
        r4 = sibling.generate(input_ids=longer, sampling_params={"max_new_tokens": 1})
        assert r4["meta_info"]["cached_tokens"] == 100  # the output token's KV was never computed
        # a different salt shares nothing
        r5 = sibling.generate(input_ids=base, sampling_params={"max_new_tokens": 1}, cache_salt="tenant-b")
        assert r5["meta_info"]["cached_tokens"] == 0
        sibling.check_integrity()
    finally:
        sibling.shutdown()


def test_small_pool_evicts_and_keeps_accounting(engine):
    small = engine.sibling(max_total_tokens=256)
    try:
        for i in range(6):
            ids = [100 + i] + list(range(5000 + 60 * i, 5000 + 60 * i + 79))
            small.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 2})
            small.check_integrity()
        stats = small.get_cache_stats()
        assert stats["evictions"] > 0 and stats["tokens_in_use"] <= 256
        assert stats["pool_capacity_tokens"] == 256
        with pytest.raises(PromptTooLong):
            small.generate(input_ids=list(range(300)), sampling_params={"max_new_tokens": 1})
        small.check_integrity()
    finally:
        small.shutdown()


def test_concurrent_threads_all_served(engine):
    results: list[dict] = []
    errors: list[BaseException] = []
    prompt = chat(engine, "You are helpful. " * 20, "Say hi.")

    def worker(i: int) -> None:
        try:
            results.append(engine.generate(prompt=prompt + str(i % 3), sampling_params=GREEDY))
        except BaseException as exc:  # noqa: BLE001 — collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 8
    by_suffix = {}
    for i, r in enumerate(sorted(results, key=lambda r: r["meta_info"]["id"])):
        by_suffix.setdefault(i, r)
    engine.check_integrity()


def test_batch_and_stream_match_single(engine):
    prompts = [chat(engine, "Be brief.", "Name a colour."), chat(engine, "Be brief.", "Name an animal.")]
    single = [engine.generate(prompt=p, sampling_params=GREEDY)["output_ids"] for p in prompts]
    batch = engine.generate(prompt=prompts, sampling_params=GREEDY)
    assert [r["output_ids"] for r in batch] == single
    chunks = list(engine.generate_stream(prompt=prompts[0], sampling_params=GREEDY))
    assert chunks[-1]["output_ids"] == single[0]
    assert chunks[-1]["meta_info"]["finish_reason"] is not None


def test_stream_closed_early_releases_locks(engine):
    stream = engine.generate_stream(prompt="Count to one hundred:", sampling_params={"max_new_tokens": 64})
    next(stream)
    stream.close()
    engine.generate(prompt="hello", sampling_params={"max_new_tokens": 1})  # the scheduler ran a step since
    engine.check_integrity()


def test_seeded_sampling_is_reproducible(engine):
    sp = {"temperature": 0.8, "top_p": 0.9, "top_k": 50, "seed": 7, "max_new_tokens": 12}
    a = engine.generate(prompt="Once upon a time", sampling_params=sp)
    b = engine.generate(prompt="Once upon a time", sampling_params=sp)
    assert a["output_ids"] == b["output_ids"]


def test_stop_strings_and_max_tokens(engine):
    r = engine.generate(
        prompt="1, 2, 3, 4,", sampling_params={"temperature": 0, "max_new_tokens": 20, "stop": [" 7"]}
    )
    assert " 7" not in r["text"] and r["meta_info"]["finish_reason"]["type"] in ("stop", "length")
    r = engine.generate(
        prompt="Hello", sampling_params={"temperature": 0, "max_new_tokens": 3, "ignore_eos": True}
    )
    assert r["meta_info"]["completion_tokens"] == 3
    assert r["meta_info"]["finish_reason"] == {"type": "length", "length": 3}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"prompt": ""},
        {"prompt": "hi", "sampling_params": {"max_new_tokens": -1}},
        {"prompt": "hi", "sampling_params": {"temperature": -0.5}},
        {"prompt": "hi", "sampling_params": {"top_p": 0}},
        {"input_ids": [1, 2, 10**9]},
        {"prompt": "hi", "input_ids": [1]},
    ],
)
def test_bad_input_is_a_typed_error(engine, kwargs):
    with pytest.raises(InvalidRequest):
        engine.generate(**kwargs)
    engine.check_integrity()


def test_prompt_longer_than_context(engine):
    with pytest.raises(PromptTooLong):
        engine.generate(input_ids=[5] * (engine.context_length + 1))


def test_flush_cache_returns_every_slot(engine):
    sibling = engine.sibling(max_total_tokens=1024)
    try:
        sibling.generate(input_ids=list(range(200, 400)), sampling_params={"max_new_tokens": 1})
        assert sibling.get_cache_stats()["tokens_in_use"] > 0
        assert sibling.flush_cache()
        stats = sibling.get_cache_stats()
        assert stats["tokens_in_use"] == 0 and stats["pool_free_tokens"] == 1024
        r = sibling.generate(input_ids=list(range(200, 400)), sampling_params={"max_new_tokens": 1})
        assert r["meta_info"]["cached_tokens"] == 0
        sibling.check_integrity()
    finally:
        sibling.shutdown()


def test_fanout_computes_shared_prefix_once(engine):
    sibling = engine.sibling(max_total_tokens=4096)
    try:
        head = list(range(3000, 3300))
        prompts = [head + [7000 + i, 7100 + i] for i in range(4)]
        results = sibling.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": 2})
        cached = sorted(r["meta_info"]["cached_tokens"] for r in results)
        assert cached == [0, 300, 300, 300]  # the leader computes the head, followers reuse it
        alone = engine.sibling(disable_radix_cache=True, max_total_tokens=1024)
        try:
            for p, r in zip(prompts, results, strict=True):
                assert (
                    alone.generate(input_ids=p, sampling_params={"temperature": 0, "max_new_tokens": 2})[
                        "output_ids"
                    ]
                    == r["output_ids"]
                )
        finally:
            alone.shutdown()
        sibling.check_integrity()
    finally:
        sibling.shutdown()


def test_idle_worker_exits_and_restarts_with_cache_intact(engine):
    """The scheduler thread retires soon after its last step (so engines that take turns do not
    hold two OpenMP pools for long: runtime/engine/threads.py) and the next request starts a new
    one: the tree, the pool and the results carry over."""
    import time

    sibling = engine.sibling(max_total_tokens=1024)
    try:
        ids = list(range(900, 1000))
        first = sibling.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 3})
        # IDLE_EXIT_S is 50 ms; the old 1 s kept a turn-taking sibling throttled for a second
        deadline = time.monotonic() + 0.9
        while sibling.scheduler.thread is not None:
            assert time.monotonic() < deadline, "idle worker did not retire within 0.9 s"
            time.sleep(0.01)
        second = sibling.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 3})
        assert second["output_ids"] == first["output_ids"]
        assert second["meta_info"]["cached_tokens"] == len(ids) - 1
        sibling.check_integrity()
    finally:
        sibling.shutdown()
    assert sibling.scheduler.thread is None or not sibling.scheduler.thread.is_alive()


def test_weights_and_pool_are_built_off_the_callers_thread(engine, monkeypatch):
    """Torch work on the caller's thread would leave it an OpenMP pool that throttles the
    scheduler's (runtime/engine/threads.py): the engine builds its model and pool in a helper thread."""
    from runtime.engine import engine as engine_module

    seen: list[str] = []
    real = engine_module.Engine._assemble

    def spy(self, *args, **kwargs):
        seen.append(threading.current_thread().name)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(engine_module.Engine, "_assemble", spy)
    engine.sibling(max_total_tokens=64).shutdown()
    assert len(seen) == 1 and seen[0].startswith("radixagent-load")

    def broken(*args, **kwargs):
        raise OSError("no such model file")

    monkeypatch.setattr(engine_module.model_files, "load", broken)
    with pytest.raises(OSError, match="no such model file"):  # the helper thread's error reaches the caller
        engine_module.Engine()


def test_waiting_requests_with_a_cached_prefix_start_first(engine):
    """Longest-prefix-first admission (SGLang's LPM): with one running slot, a request whose
    document is cached starts before an earlier-queued request with nothing cached."""
    sibling = engine.sibling(max_total_tokens=2048, max_running_requests=1)
    try:
        doc = list(range(4000, 4300))
        sibling.generate(input_ids=doc + [11], sampling_params={"max_new_tokens": 1})
        fresh, warm = list(range(6000, 6300)) + [12], doc + [13]
        sp = {"temperature": 0, "max_new_tokens": 2}
        first, second = sibling.generate(input_ids=[fresh, warm], sampling_params=sp)  # fresh queued first
        assert second["meta_info"]["cached_tokens"] == len(doc)
        assert second["meta_info"]["ttft"] < first["meta_info"]["ttft"]
        alone = engine.sibling(max_total_tokens=1024, disable_radix_cache=True, max_running_requests=1)
        try:  # the order changes nothing in the outputs
            out = alone.generate(input_ids=[fresh, warm], sampling_params=sp)
            assert [r["output_ids"] for r in out] == [first["output_ids"], second["output_ids"]]
            a, b = out
            assert a["meta_info"]["ttft"] < b["meta_info"]["ttft"]  # no cache: arrival order
        finally:
            alone.shutdown()
        sibling.check_integrity()
    finally:
        sibling.shutdown()
