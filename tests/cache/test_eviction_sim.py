from __future__ import annotations

import json

from evals.eviction.cli import main
from evals.eviction.simulator import Replay, budget_for
from evals.eviction.workloads import make

ROW_KEYS = {"workload", "sessions", "budget_fraction", "policy", "prompt_tokens", "cached_tokens", "hit_rate",
            "recomputed_tokens", "seconds"}


def test_cli_small_run_writes_schema(tmp_path) -> None:
    rc = main(["--workloads", "agents,chat,chat-sessions", "--sessions", "6", "--budgets", "0.25,1",
               "--steps", "4,6", "--out", str(tmp_path)])
    assert rc == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert isinstance(results["budget_definition"], str) and results["budget_definition"]
    assert len(results["rows"]) == 3 * 2 * 7
    for row in results["rows"]:
        assert row.keys() >= ROW_KEYS
        assert 0 <= row["hit_rate"] <= 1 and row["recomputed_tokens"] >= 0
    assert (tmp_path / "report.md").exists()
    assert (tmp_path / "hit_rate_agents_6.png").exists()


def test_chat_without_events_is_exactly_lru() -> None:
    w = make("chat", 12, seed=3)
    peak = Replay(w, "lru", None).run().peak_working_set
    budget = budget_for(w, 0.25, peak)
    lru, session = Replay(w, "lru", budget).run(), Replay(w, "session", budget).run()
    assert (lru.cached_tokens, lru.recomputed_tokens) == (session.cached_tokens, session.recomputed_tokens)


def test_infinite_cache_recomputes_nothing() -> None:
    w = make("agents", 6, seed=1, steps=(4, 8))
    st = Replay(w, "lru", None).run()
    assert st.recomputed_tokens == 0 and st.peak_working_set > 0
