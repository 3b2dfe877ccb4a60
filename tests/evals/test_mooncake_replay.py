"""Mooncake trace replays on small hand-written traces (no model): exact hit counts per policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evals.eviction.cli import main
from evals.eviction.mooncake import TraceError, infinite_reuse, load_mooncake
from evals.eviction.trace_replay import POLICIES, CostModel, replay

ROW_KEYS = {
    "workload",
    "mode",
    "capacity_blocks",
    "block_hit_rate",
    "hit_rate",
    "recomputed_tokens",
    "policy",
    "seconds",
}


def write_trace(path: Path, requests: list[tuple[float, int, int, list[int]]]) -> Path:
    lines = [
        json.dumps({"timestamp": ts, "input_length": n_in, "output_length": n_out, "hash_ids": ids})
        for ts, n_in, n_out, ids in requests
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def one_block_trace(tmp_path: Path, blocks: str) -> Path:
    """One full 512-token block per request, one request per second."""
    ids = {c: i for i, c in enumerate(sorted(set(blocks)))}
    return write_trace(
        tmp_path / "letters_trace.jsonl", [(1000 * t, 512, 8, [ids[c]]) for t, c in enumerate(blocks)]
    )


def hits(
    path: Path, capacity: int | None, mode: str = "hitrate", cost: CostModel | None = None
) -> dict[str, int]:
    trace = load_mooncake(path)
    return {p: replay(trace, mode, p, capacity, cost).cached_blocks for p in POLICIES}


def test_cyclic_reuse_defeats_every_online_policy_but_not_belady(tmp_path: Path) -> None:
    # a b c a b c in 2 blocks: LRU/FIFO/LFU/SLRU always evict the block needed next; Belady keeps
    # a at r2 (b is needed later than a) and c at r4 (a is never needed again): 2 hits.
    got = hits(one_block_trace(tmp_path, "abcabc"), capacity=2)
    assert got == {"lru": 0, "lfu": 0, "fifo": 0, "slru": 0, "priority": 0, "session": 0, "oracle": 2}


def test_frequency_separates_lfu_and_slru_from_recency(tmp_path: Path) -> None:
    # a a a b c a in 2 blocks: at c, LRU and FIFO evict a (older), LFU/SLRU/Belady evict b.
    got = hits(one_block_trace(tmp_path, "aaabca"), capacity=2)
    assert got == {"lru": 2, "lfu": 3, "fifo": 2, "slru": 3, "priority": 2, "session": 2, "oracle": 3}


def prefix_trace(tmp_path: Path) -> Path:
    s, x1, x2, y1, y2, x3 = 100, 1, 2, 3, 4, 5
    return write_trace(
        tmp_path / "prefix_trace.jsonl",
        [
            (0, 1000, 10, [s, x1]),  # S + x1: one node until r1 splits it at S
            (10, 1000, 10, [s, x2]),  # hits S (512 tokens)
            (20, 512, 10, [y1]),  # pool full: evicts x1 (oldest leaf)
            (30, 512, 10, [y2]),  # evicts x2; S becomes a leaf
            (40, 600, 10, [s, x3]),  # hits S (still cached), evicts y1 (S is locked by the match)
            (50, 512, 10, [y1]),  # y1 was computed before but evicted: 512 recomputed tokens
        ],
    )


def test_prefix_sharing_in_the_radix_tree_exact_counts(tmp_path: Path) -> None:
    trace = load_mooncake(prefix_trace(tmp_path))
    r = replay(trace, "hitrate", "lru", 3)
    assert (r.prompt_blocks, r.cached_blocks) == (9, 2)
    assert (r.prompt_tokens, r.cached_tokens, r.recomputed_tokens) == (4136, 1024, 512)
    assert r.block_hit_rate == pytest.approx(2 / 9) and r.hit_rate == pytest.approx(1024 / 4136)
    assert r.evicted_blocks == 4  # x1 (r2), x2 (r3), y1 (r4), y2 (r5: older than x3)
    inf = replay(trace, "hitrate", "lru", None)
    assert (inf.cached_blocks, inf.recomputed_tokens, inf.evicted_blocks) == (3, 0, 0)
    assert (
        replay(trace, "hitrate", "oracle", 3).cached_blocks,
        replay(trace, "hitrate", "session", 3).cached_blocks,
    ) == (3, 2)


def test_infinite_capacity_matches_the_policy_free_figure(tmp_path: Path) -> None:
    path = write_trace(
        tmp_path / "t_trace.jsonl",
        [
            (0, 1300, 5, [1, 2, 3]),
            (1, 1100, 5, [1, 2, 4]),
            (2, 100, 5, [9]),
            (3, 100, 5, [9]),
            (4, 800, 5, [1, 7]),
        ],
    )
    trace = load_mooncake(path)
    fig = infinite_reuse(trace)
    assert (fig.prompt_blocks, fig.reused_blocks, fig.reused_tokens) == (10, 4, 512 * 2 + 100 + 512)
    for mode in ("hitrate", "timed"):
        r = replay(trace, mode, "lfu", None, CostModel(0.0, 0.0))
        assert (r.cached_blocks, r.cached_tokens) == (fig.reused_blocks, fig.reused_tokens), mode


def test_prefix_ids_follow_paths_not_raw_ids(tmp_path: Path) -> None:
    # id 2 under 1 and id 2 under 5 are different prefixes: the second request matches nothing
    trace = load_mooncake(
        write_trace(
            tmp_path / "p_trace.jsonl", [(0, 1024, 1, [1, 2]), (1, 1024, 1, [5, 2]), (2, 1024, 1, [1, 2])]
        )
    )
    assert trace.distinct_blocks == 4 and infinite_reuse(trace).reused_blocks == 2


def test_timed_replay_in_flight_kv_queues_and_locks(tmp_path: Path) -> None:
    a, b, c, d = 1, 2, 3, 4
    path = write_trace(
        tmp_path / "timed_trace.jsonl",
        [
            (0, 1024, 0, [a, b]),  # runs 1.024 s, holds 2 blocks
            (0, 1024, 512, [a, c]),  # needs 3 blocks, 2 free: waits; at 1.024 s matches a (just inserted)
            (2000, 512, 0, [d]),  # pool full: evicts b (a is locked by the running request)
            (7000, 1024, 0, [a, b]),  # a still cached, b recomputed
        ],
    )
    cost = CostModel(prefill_s_per_token=0.001, decode_s_per_token=0.01)
    trace = load_mooncake(path)
    for policy in POLICIES:
        r = replay(trace, "timed", policy, 4, cost)
        assert (r.prompt_blocks, r.cached_blocks, r.cached_tokens, r.recomputed_tokens) == (
            7,
            2,
            1024,
            512,
        ), policy
        assert r.queue_wait_s == pytest.approx(1.024) and r.makespan_s == pytest.approx(7.512)
        assert r.evicted_blocks == 1
    # the same trace in hit-rate mode has no in-flight KV: r1 hits a at once
    assert replay(trace, "hitrate", "lru", 4).cached_blocks == 3


def test_timed_capacity_below_one_request_is_refused(tmp_path: Path) -> None:
    trace = load_mooncake(write_trace(tmp_path / "big_trace.jsonl", [(0, 2048, 1024, [1, 2, 3, 4])]))
    with pytest.raises(ValueError, match="largest request"):
        replay(trace, "timed", "lru", 5)
    assert (
        replay(trace, "hitrate", "lru", 2).prompt_blocks == 4
    )  # a prompt larger than the pool keeps what fits


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n{"timestamp": 1, "input_len',
            ":2: not valid JSON",
        ),
        (
            '{"timestamp": 5, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n'
            '{"timestamp": 4, "input_length": 5, "output_length": 1, "hash_ids": [1]}',
            ":2: timestamp 4 ms is before",
        ),
        ('{"timestamp": 0, "input_length": 5, "output_length": 1}', ":1: missing field(s) 'hash_ids'"),
        (
            '\n\n{"timestamp": 0, "input_length": -5, "output_length": 1, "hash_ids": [1]}',
            ":3: field 'input_length'",
        ),
        (
            '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, "x"]}',
            ":1: field 'hash_ids'",
        ),
        ("[1, 2]", ":1: expected a JSON object"),
        ("", "no requests"),
        (
            '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n\xff\xfe',
            ":2: not UTF-8",
        ),
    ],
)
def test_loader_errors_name_the_line(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(TraceError) as err:
        load_mooncake(path)
    assert str(path) in str(err.value) and needle in str(err.value)


def test_cli_bad_trace_exits_2_with_the_line_and_no_traceback(tmp_path: Path, capsys) -> None:
    path = tmp_path / "bad_trace.jsonl"
    path.write_text(
        '{"timestamp": 3, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n'
        '{"timestamp": 2, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n'
    )
    assert main(["--trace", str(path), "--trace-format", "mooncake", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "bad_trace.jsonl:2" in err and "Traceback" not in err
    for bad, needle in (
        (["--capacities", "10,zero"], "--capacities"),
        (["--policies", "lru,mru"], "mru"),
        (["--capacities", "1", "--modes", "timed"], "largest request"),
    ):
        good = one_block_trace(tmp_path, "ab")
        assert main(["--trace", str(good), *bad, "--out", str(tmp_path / "o")]) == 2
        assert needle in capsys.readouterr().err


def test_cli_writes_schema_rows_report_and_chart(tmp_path: Path) -> None:
    path = prefix_trace(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text(
        json.dumps(
            {
                "budget_definition": "sim",
                "rows": [{"workload": "agents", "sessions": 8, "budget_fraction": 0.25, "policy": "lru"}],
            }
        )
    )
    argv = ["--trace", str(path), "--trace-format", "mooncake", "--capacities", "3,inf", "--out", str(out)]
    for _ in range(2):  # a second run replaces its rows instead of appending duplicates
        assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    rows = [r for r in results["rows"] if r["workload"] == "mooncake-prefix"]
    assert len(rows) == 2 * 2 * len(POLICIES) and len(results["rows"]) == len(rows) + 1
    assert results["budget_definition"] == "sim" and "512" in results["trace_replay_definition"]
    for row in rows:
        assert row.keys() >= ROW_KEYS and 0 <= row["block_hit_rate"] <= 1
        assert row["capacity_blocks"] in (3, None) and row["mode"] in ("hitrate", "timed")
    lru = next(r for r in rows if (r["mode"], r["capacity_blocks"], r["policy"]) == ("hitrate", 3, "lru"))
    assert (lru["cached_blocks"], lru["recomputed_tokens"], lru["headroom_captured"]) == (2, 512, 0.0)
    oracle = next(
        r for r in rows if (r["mode"], r["capacity_blocks"], r["policy"]) == ("hitrate", 3, "oracle")
    )
    assert oracle["headroom_captured"] == 1.0
    assert results["traces"][0]["infinite_block_hit_rate"] == pytest.approx(3 / 9)
    assert (out / "hit_rate_mooncake-prefix.png").stat().st_size > 1000
    report = (out / "report-mooncake.md").read_text()
    assert "mooncake-prefix" in report and "policy-free" in report


def chat_like_trace(tmp_path: Path, seed: int, n: int = 80) -> Path:
    """Conversations over 3 shared system-prompt blocks: each next turn keeps the previous
    prompt's full blocks and replaces its partial last block, as the Mooncake chat trace does."""
    import random

    rng, convs, reqs, next_id, t = random.Random(seed), [], [], iter(range(1000, 10**6)), 0
    for _ in range(n):
        t += rng.randint(0, 500)
        if convs and rng.random() < 0.6:
            conv = rng.choice(convs)
            conv[:] = conv[:-1] + [next(next_id) for _ in range(rng.randint(1, 2))]
            if len(conv) > 10:
                convs.remove(conv)
        else:
            conv = [rng.choice([1, 2, 3])] * (rng.random() < 0.7) + [
                next(next_id) for _ in range(rng.randint(1, 4))
            ]
            convs.append(conv)
        reqs.append((t, 512 * len(conv) - rng.randint(0, 500), rng.randint(1, 700), list(conv)))
    return write_trace(tmp_path / f"chat{seed}_trace.jsonl", reqs)


def test_generated_chat_traces_session_is_lru_and_belady_leads_hitrate(tmp_path: Path) -> None:
    cost = CostModel(prefill_s_per_token=0.001, decode_s_per_token=0.01)
    for seed in range(4):
        trace = load_mooncake(chat_like_trace(tmp_path, seed))
        ceiling = infinite_reuse(trace).reused_blocks
        for mode in ("hitrate", "timed"):
            for cap in (16, 24, 48):
                got = {p: replay(trace, mode, p, cap, cost, check=True) for p in POLICIES}
                lru, sess = got["lru"], got["session"]
                # no hints: the session policy's documented fallback is LRU's order exactly
                assert (sess.cached_blocks, sess.recomputed_tokens) == (
                    lru.cached_blocks,
                    lru.recomputed_tokens,
                )
                assert all(r.cached_blocks <= ceiling for r in got.values())
                if mode == "hitrate":  # Belady is not an optimum once hits change durations (timed)
                    assert got["oracle"].cached_blocks == max(r.cached_blocks for r in got.values())
