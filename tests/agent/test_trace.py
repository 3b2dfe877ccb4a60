"""Trace: ideal_cached_tokens, prefix-break detection with exact offsets, JSONL per step, CLI."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest

from agent import Agent, PrefixBreakWarning, SessionLedger, StepRecord, read_trace
from agent.trace import common_prefix
from agent.trace_cli import main as trace_main
from agent.trace_cli import summarize
from tests.support.behaviour import SYSTEM, add
from tests.support.fake_backend import FakeBackend, arithmetic_model
from tests.support.trace_records import step_dict

TRACE_FIELDS = [
    "run_id",
    "session_id",
    "branch",
    "step",
    "kind",
    "prompt_tokens",
    "cached_tokens",
    "ideal_cached_tokens",
    "completion_tokens",
    "ttft_s",
    "latency_s",
    "finish_reason",
    "prefix_break",
    "tool",
    "miss",
]


def test_step_record_has_exactly_the_design_fields():
    assert [f.name for f in dataclasses.fields(StepRecord)] == TRACE_FIELDS


def test_ideal_is_longest_prefix_over_all_earlier_sequences():
    ledger = SessionLedger()
    assert ledger.ideal([1, 2, 3]) == 0
    ledger.record(0, [1, 2, 3], [4, 5])
    ledger.record(1, [1, 2, 9], [7])
    assert ledger.ideal([1, 2, 3, 4, 5, 6]) == 5  # extends branch 0's prompt+output
    assert ledger.ideal([1, 2, 9, 7, 8]) == 4  # follows branch 1 through the shared trie
    assert ledger.ideal([1, 2, 3, 4, 5]) == 4  # capped at len-1: the last position is recomputed
    assert ledger.ideal([2, 1]) == 0


def test_break_offsets_and_declared_rollbacks():
    ledger = SessionLedger()
    ledger.record(0, [1, 2, 3, 4], [5])
    assert ledger.check(0, [1, 2, 3, 4, 5, 6]) is None
    brk = ledger.check(0, [1, 2, 7, 4, 5, 6])
    assert brk["offset"] == 2 and brk["unit"] == "tokens"
    ledger.expect(0, [1, 2])  # a declared rollback to a checkpoint of two tokens
    assert ledger.check(0, [1, 2, 8]) is None
    assert ledger.check(3, [9]) is None  # an unknown branch has nothing to extend
    text = SessionLedger()
    text.record(0, "hello world", "!")
    brk = text.check(0, "hello there")
    assert brk == {
        "offset": 6,
        "unit": "chars",
        "expected": "'world!'",
        "got": "'there'",
        "reference": "branch",
    }


def _schema_system(orders):
    def system() -> str:
        keys = next(orders)
        schema = {k: {"a": "integer", "b": "integer"}[k] for k in keys}
        return SYSTEM + "\nTool add: " + json.dumps(schema)  # not canonical: key order leaks in

    return system


@pytest.mark.parametrize("ids", [True, False], ids=["token_ids", "text"])
def test_schema_order_change_detected_at_exact_offset(ids):
    backend = FakeBackend(arithmetic_model, supports_input_ids=ids)
    orders = iter([("a", "b")] * 2 + [("b", "a")] * 10)  # checkpoint + step 0 see a,b; later b,a
    agent = Agent(backend, system=_schema_system(orders), tools=[add], reflect=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = agent.run("What is 17 + 25?")
    brk = result.trace[1].prefix_break
    assert brk is not None and result.trace[0].prefix_break is None
    first, second = backend.calls[0], backend.calls[1]
    if ids:
        assert brk["offset"] == common_prefix(first.input_ids, second.input_ids)
        assert brk["offset"] == len(backend.tokenize("<|im_start|>system\n" + SYSTEM + '\nTool add: {"'))
    else:
        assert brk["offset"] == len("<|im_start|>system\n" + SYSTEM + '\nTool add: {"')
        assert brk["expected"].startswith("'a") and brk["got"].startswith("'b")
    assert [w.category for w in caught].count(PrefixBreakWarning) == 1


def test_ideal_counts_hits_a_disabled_cache_missed():
    backend = FakeBackend(arithmetic_model, cache_enabled=False)
    result = Agent(backend, system=SYSTEM, tools=[add]).run("What is 17 + 25?")
    first, second = result.trace
    assert second.cached_tokens == 0
    assert second.ideal_cached_tokens == first.prompt_tokens + first.completion_tokens
    assert result.cache_fidelity == 0.0


def test_session_ledger_spans_runs_of_one_session():
    backend = FakeBackend(arithmetic_model)
    agent = Agent(backend, system=SYSTEM, tools=[add], session_id="s")
    agent.run("What is 1 + 2?")
    again = agent.run("What is 1 + 2?")
    assert again.trace[0].ideal_cached_tokens == again.trace[0].prompt_tokens - 1
    assert not again.prefix_breaks  # a new run is a new branch start, not a break


def test_jsonl_written_and_flushed_per_step(tmp_path):
    path = tmp_path / "trace.jsonl"
    agent = Agent(FakeBackend(arithmetic_model), system=SYSTEM, tools=[add], trace_path=path)
    run = agent.start("What is 17 + 25?")
    for expected_lines in (1, 2):
        run.step()
        lines = path.read_text().splitlines()
        assert len(lines) == expected_lines  # flushed before the next step starts
        assert list(json.loads(lines[-1])) == TRACE_FIELDS
    assert run.done and read_trace(path) == run.trace
    agent.close()


def test_trace_cli_prints_table_and_summary(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    Agent(FakeBackend(arithmetic_model), system=SYSTEM, tools=[add], trace_path=path).fork(
        2, "What is 2 + 2?"
    )
    assert trace_main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "cache fidelity 1.000" in out and "breaks 0" in out and "fork" in out
    summary = summarize(read_trace(path))
    assert summary.steps == 5 and summary.cached_tokens == summary.ideal_cached_tokens
    assert trace_main([str(tmp_path / "missing.jsonl")]) == 2


def test_read_trace_skips_a_torn_last_line(tmp_path):
    import json
    import warnings

    from agent.trace import read_trace

    good = step_dict()
    path = tmp_path / "trace.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(good)[:40])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = read_trace(path)
    assert len(records) == 1 and any("incomplete last line" in str(w.message) for w in caught)
    path.write_text(json.dumps(good)[:40] + "\n" + json.dumps(good) + "\n")
    import pytest

    with pytest.raises(ValueError, match=":1:"):
        read_trace(path)
