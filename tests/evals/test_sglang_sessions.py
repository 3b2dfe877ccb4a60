"""The SGLang session-workload tally (evals/eviction/sglang_sessions.py): what an unbounded cache would have
served, and the recomputed tokens derived from it."""

from __future__ import annotations

from evals.eviction.sglang_sessions import Tally


def test_recomputed_is_ideal_minus_served() -> None:
    t = Tally()
    t.add([1, 2, 3, 4], [9], cached=0)
    t.add([1, 2, 3, 4, 9, 5, 6], [7], cached=0)  # an unbounded cache had 5 of these (prompt + output)
    t.add([1, 2, 8], [7], cached=2)
    t.add([5, 5], [], cached=0)
    row = t.row("x", 1.0)
    assert row["ideal_cached_tokens"] == 0 + 5 + 2 + 0
    assert row["recomputed_tokens"] == 7 - 2 and row["cached_tokens"] == 2
    assert row["prompt_tokens"] == 16 and row["hit_rate"] == round(2 / 16, 4)
    t2 = Tally()
    t2.add([1, 2], [3], cached=0)
    t2.add([1, 2], [3], cached=1)  # the last prompt token is always computed
    assert t2.row("y", 0.0)["recomputed_tokens"] == 0
