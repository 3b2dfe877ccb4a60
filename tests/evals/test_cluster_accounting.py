"""eval-cluster's token accounting (no model, no processes): recomputed vs new prompt tokens."""

from __future__ import annotations

from evals.cluster.cli import (
    Call,
    Workload,
    account_calls,
    common_prefix_len,
    ideal_cached,
    report,
    split_uncached,
    summarize,
    verdict,
)

DOC = list(range(100, 140))  # the shared document head, 40 tokens


def test_common_prefix_len() -> None:
    assert common_prefix_len([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix_len([1, 2], [1, 2, 3]) == 2
    assert common_prefix_len([], [1]) == 0
    assert common_prefix_len([5], [6]) == 0


def test_ideal_counts_only_requests_completed_before_the_call_was_sent() -> None:
    a0 = DOC + [1, 2]  # session a, step 0
    b0 = DOC + [3]  # session b, step 0, in flight together with a0
    a1 = a0 + [7, 8, 9]  # session a, step 1: extends its own previous prompt
    b1 = b0 + [4, 5]
    c0 = DOC + [6]  # session c arrives after a0 finished: the document head counts
    ids = [a0, b0, a1, b1, c0]
    sent = [0.0, 0.1, 2.0, 2.5, 1.5]
    done = [1.0, 1.2, 3.0, 3.5, 2.4]
    assert ideal_cached(ids, sent, done) == [0, 0, len(a0), len(b0), len(DOC)]


def test_split_uncached_caps_ideal_and_keeps_the_identity() -> None:
    # follow-up routed to a worker that only holds the document
    assert split_uncached(prompt_tokens=50, cached=40, ideal=45) == (45, 5, 5)
    # identical prompt: the engine never serves the last token, so a 49-token hit is perfect
    assert split_uncached(prompt_tokens=50, cached=49, ideal=50) == (49, 0, 1)
    # queued behind a twin that finished first: cached beyond ideal is not negative recompute
    assert split_uncached(prompt_tokens=50, cached=40, ideal=0) == (0, 0, 10)
    for prompt, cached, ideal in [(50, 10, 45), (50, 0, 0), (9, 8, 100), (30, 29, 12)]:
        _, recomputed, new = split_uncached(prompt, cached, ideal)
        assert recomputed + new == prompt - cached and recomputed >= 0 and new >= 1


def _call(session: int, step: int, prompt: list[int], cached: int, sent: float, done: float) -> Call:
    return Call(session, step, len(prompt), cached, 0.1, 0.2, sent=sent, done=done)


def test_round_robin_recomputes_previous_steps_affinity_does_not() -> None:
    a0, b0 = DOC + [1], DOC + [2]
    a1, b1 = a0 + [10, 11, 12], b0 + [20, 21, 22]
    a2, b2 = a1 + [13, 14], b1 + [23, 24]
    ids = [a0, b0, a1, b1, a2, b2]
    times = [(0.0, 1.0), (1.1, 2.0), (2.1, 3.0), (3.1, 4.0), (4.1, 5.0), (5.1, 6.0)]
    # round_robin over 2 workers: a on W0,W1,W0; b on W1,W0,W1 -> each follow-up finds only the
    # document (+ its own step-before-last) on its worker
    rr_cached = [0, 0, len(DOC), len(DOC), len(a0), len(b0)]
    # affinity: a on W0, b on W1 -> every follow-up hits its previous prompt
    sticky_cached = [0, 0, len(a0), len(b0), len(a1), len(b1)]
    rows = {}
    for mode, cached in (("round_robin", rr_cached), ("session", sticky_cached)):
        calls = [
            _call(i % 2, i // 2, p, c, *t) for i, (p, c, t) in enumerate(zip(ids, cached, times, strict=True))
        ]
        assert account_calls(calls, ids) == 0
        rows[mode] = summarize(mode, calls, 6.0, [{"url": "w", "requests": 6, "evicted_tokens": 0}])
    rr, s = rows["round_robin"], rows["session"]
    # b0 recomputes the document a0 had computed (it went to the other worker) in both modes
    assert s["recomputed_prefill_tokens"] == len(DOC)
    assert rr["recomputed_prefill_tokens"] == len(DOC) + 1 + 1 + 3 + 3
    assert rr["new_prompt_tokens"] == s["new_prompt_tokens"]
    for r in (rr, s):
        assert r["uncached_prompt_tokens"] == r["recomputed_prefill_tokens"] + r["new_prompt_tokens"]
    checks = verdict([rr, s])
    assert checks["recompute_reduction_vs_round_robin"] == rr["recomputed_prefill_tokens"] / len(DOC)
    assert not checks["meets_1_5x_fewer_recomputed"]  # 48 vs 40: only 1.2x
    s_zero = {**s, "recomputed_prefill_tokens": 0}
    assert verdict([rr, s_zero])["recompute_reduction_vs_round_robin"] is None
    assert verdict([rr, s_zero])["meets_1_5x_fewer_recomputed"]
    text = report(Workload(), [rr, s], checks, quick=True, router="sglang-router 0.3.2")
    assert "| recomputed prefill | new prompt | uncached prompt |" in text
    assert "behind sglang-router 0.3.2;" in text and "tool waits uniform in 0.2-1.0 s" in text


def test_token_count_mismatch_is_reported() -> None:
    calls = [_call(0, 0, DOC, 0, 0.0, 1.0)]
    assert account_calls(calls, [DOC + [1]]) == 1


def test_tool_wait_and_router_flags() -> None:
    import argparse

    import pytest

    from evals.cluster.cli import SESSION_LABELS, _wait_range, parse

    assert _wait_range("5,15") == (5.0, 15.0)
    assert _wait_range("2") == (2.0, 2.0)
    for bad in ("15,5", "-1,2", "a,b", "1,2,3"):
        with pytest.raises(argparse.ArgumentTypeError):
            _wait_range(bad)
    ns = parse(["--tool-wait", "5,15", "--router", "smg"])
    assert ns.tool_wait == (5.0, 15.0) and ns.router == "smg"
    assert parse([]).tool_wait == (0.2, 1.0) and parse([]).router == "auto"
    with pytest.raises(ValueError):
        Workload(tool_wait_s=(2.0, 1.0))
    w = Workload(tool_wait_s=(5.0, 15.0))
    row = {
        **summarize(
            "session",
            [_call(0, 0, DOC, 0, 0.0, 1.0)],
            1.0,
            [{"url": "w", "requests": 1, "evicted_tokens": 0}],
        ),
        "label": SESSION_LABELS["smg"],
        "router_flags": ["--policy", "cache_aware", "--routing-key-override"],
    }
    text = report(w, [row], {}, quick=False, router="smg 1.13.0")
    assert "behind smg 1.13.0;" in text and "tool waits uniform in 5.0-15.0 s" in text
    assert "session: `--policy cache_aware --routing-key-override`" in text
