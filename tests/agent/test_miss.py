"""Miss attribution (runtime/trace/ledger.py) over synthetic step sequences: no model, exact counts."""

from __future__ import annotations

import random

import pytest

from runtime.trace.ledger import Matches, Served, SessionLedger, StepAccounting, StepEvent, attribute


def step(acc: StepAccounting, prompt: list[int], out: list[int], served: Served, **kw) -> dict[str, int]:
    ev = StepEvent(
        branch=kw.pop("branch", 0),
        sent=prompt,
        sent_output=out,
        units=prompt,
        outputs=out,
        served=served,
        **kw,
    )
    account = acc.observe(ev)
    assert sum(account.miss.values()) == served.prompt_tokens - served.cached_tokens
    return account.miss


def test_extending_prompts_miss_only_new() -> None:
    acc = StepAccounting(SessionLedger())
    p1 = list(range(100))
    assert step(acc, p1, [500, 501], Served(100, 0, 0)) == {"new": 100}
    p2 = p1 + [500, 501] + list(range(200, 230))
    assert step(acc, p2, [7], Served(len(p2), 102, 0)) == {"new": 30}


def test_whole_prompt_seen_is_last_token() -> None:
    acc = StepAccounting(SessionLedger())
    p = list(range(50))
    step(acc, p, [1], Served(50, 0, 0))
    assert step(acc, p, [1], Served(50, 49, 0)) == {"last_token": 1}


def test_prompt_change_counts_from_the_break() -> None:
    acc = StepAccounting(SessionLedger())
    p1 = list(range(100))
    step(acc, p1, [900], Served(100, 0, 0))
    p2 = list(range(40)) + [777] + list(range(41, 100)) + [900] + [5, 6, 7]
    miss = step(acc, p2, [1], Served(len(p2), 40, 0))
    assert miss == {"prompt_change": 101 - 40, "new": len(p2) - 101}


def test_eviction_confirmed_or_inferred_and_unexplained() -> None:
    acc = StepAccounting(SessionLedger())
    p1 = list(range(100))
    step(acc, p1, [900], Served(100, 0, 0))
    p2 = p1 + [900, 1, 2]
    # the tree never holds an output's last token (sampled, not fed): 1 of the 41 is by rule
    assert step(acc, p2, [1], Served(len(p2), 60, evicted_tokens=40)) == {
        "eviction": 40,
        "last_token": 1,
        "new": 2,
    }
    p3 = p2 + [1, 3]
    assert step(acc, p3, [1], Served(len(p3), 60, evicted_tokens=None)) == {
        "eviction_inferred": 43,
        "last_token": 1,
        "new": 1,
    }
    p4 = p3 + [1, 4]
    assert step(acc, p4, [1], Served(len(p4), 60, evicted_tokens=10)) == {
        "eviction": 10,
        "unexplained": 35,
        "last_token": 1,
        "new": 1,
    }


def test_namespace_routing_cache_off() -> None:
    acc = StepAccounting(SessionLedger())
    p1 = list(range(80))
    step(acc, p1, [9], Served(80, 0, 0), salt="a", worker="w0")
    p2 = p1 + [9, 1]
    assert step(acc, p2, [8], Served(82, 0, 0), salt="b", worker="w0") == {"namespace": 81, "new": 1}
    p3 = p2 + [8, 2]
    # salt a, other worker: a holds p1+9 on w0 (81) and b holds p2+8 (83): 81 routing, 2 namespace
    assert step(acc, p3, [7], Served(84, 0, 0), salt="a", worker="w1") == {
        "namespace": 2,
        "routing": 81,
        "new": 1,
    }
    p4 = p3 + [7, 3]
    assert step(acc, p4, [6], Served(86, 0, 0, cache_off=True), salt="a", worker="w1") == {
        "cache_off": 85,
        "new": 1,
    }


def test_granularity_on_paged_engines() -> None:
    miss = attribute(Served(100, 64, evicted_tokens=0, page_size=16), Matches(90, 90, 90), None)
    assert miss == {"granularity": 90 % 16, "unexplained": 90 - 64 - 90 % 16, "new": 10}


def test_declared_rollback_is_not_a_prompt_change() -> None:
    ledger = SessionLedger()
    acc = StepAccounting(ledger)
    p1 = list(range(60))
    step(acc, p1, [1, 2], Served(60, 0, 0))
    ledger.expect(0, p1[:30])  # rollback to a checkpoint
    p2 = p1[:30] + [44, 45]
    assert step(acc, p2, [1], Served(32, 30, 0)) == {"new": 2}


def test_cached_above_ideal_is_never_negative() -> None:
    acc = StepAccounting(SessionLedger())
    # another session cached the shared head: the hit exceeds this session's ideal
    assert step(acc, list(range(40)), [1], Served(40, 30, 0)) == {"new": 10}


@pytest.mark.parametrize("seed", range(20))
def test_random_sequences_always_sum(seed: int) -> None:
    rng = random.Random(seed)
    acc = StepAccounting(SessionLedger())
    prompt: list[int] = [rng.randrange(5) for _ in range(20)]
    for _ in range(15):
        out = [rng.randrange(5) for _ in range(rng.randrange(1, 4))]
        cached = rng.randrange(len(prompt))
        served = Served(len(prompt), cached, rng.choice([None, 0, rng.randrange(50)]), rng.random() < 0.1)
        step(acc, prompt, out, served, salt=rng.choice(["a", "b"]), worker=rng.choice(["0", "1"]))
        prompt = prompt + out + [rng.randrange(5) for _ in range(rng.randrange(1, 6))]
        if rng.random() < 0.3:
            prompt[rng.randrange(len(prompt))] = 9


def test_previous_outputs_last_token_is_never_cached() -> None:
    """The engine feeds every output token but the last: the next turn misses it by rule."""
    acc = StepAccounting(SessionLedger())
    p1, out = list(range(30)), [100, 101, 102]
    step(acc, p1, out, Served(30, 0, 0))
    p2 = p1 + out + [7, 8]
    assert step(acc, p2, [1], Served(35, 32, 0)) == {"last_token": 1, "new": 2}
    p3 = p2 + [1, 9]
    assert step(acc, p3, [1], Served(37, 20, evicted_tokens=15)) == {
        "last_token": 1,
        "eviction": 15,
        "new": 1,
    }


def _record(step: int, miss: dict[str, int], brk: dict | None = None):
    from runtime.trace.record import StepRecord

    total = sum(miss.values())
    return StepRecord("r", "s", 0, step, "act", total + 10, 10, 10, 1, 0.0, 0.0, "stop", brk, None, miss)


def test_cause_sentence_and_table() -> None:
    from agent.trace_cli import build_table, cause_sentence, miss_cell

    records = [
        _record(0, {"new": 92}),
        _record(4, {"prompt_change": 2}, {"offset": 3, "piece": "system message line 3"}),
        _record(7, {"eviction": 2}),
        _record(8, {"eviction": 2}),
        _record(9, {"eviction": 2}),
    ]
    assert cause_sentence(records) == (
        "92% of uncached tokens were new, 6% evicted at steps 7-9, "
        "2% a prompt change at step 4: system message line 3 changed"
    )
    assert miss_cell(records[2]) == "evict 2"
    assert build_table(records).row_count == 5


def test_template_rewrite_takes_the_prompt_change_and_names_the_turn() -> None:
    acc = StepAccounting(SessionLedger())
    p1 = list(range(100))
    step(acc, p1, [900, 901, 902], Served(100, 0, 0))
    p2 = p1 + [902] + [5, 6, 7]  # the template dropped 900, 901 (turn 1's thinking block)
    rewrite = {"message": 2, "dropped": "<think>plan</think>"}
    ev = StepEvent(0, p2, [1], p2, [1], Served(len(p2), 100, 0), rewrites=(rewrite,))
    account = acc.observe(ev)
    assert account.miss == {"template_rewrite": 3, "new": 1}  # as prompt_change counts it
    assert sum(account.miss.values()) == len(p2) - 100
    assert account.prefix_break is not None and account.prefix_break["cause"] == "template_rewrite"
    assert account.prefix_break["rewrites"] == [rewrite]


def test_a_new_run_is_checked_against_the_sessions_last_prompt() -> None:
    """Issue 35: two runs of one session; the second changes a system line before a document.
    The tokens that would have been served but for the change are `prompt_change`, not `new`,
    and the break shows the changing span."""
    ledger = SessionLedger()
    acc = StepAccounting(ledger)
    head, doc = list(range(10)), list(range(1000, 1300))
    run1 = head + [50] + doc + [60, 61]  # system line 50, the document, task 1
    step(acc, run1, [70, 71], Served(len(run1), 0, 0))
    ledger.expect(0, ())  # agent.start(): a new run, nothing of its own to extend yet
    run2 = head + [51] + doc + [62, 63]  # the system line changed; then the same document
    ev = StepEvent(0, run2, [1], run2, [1], Served(len(run2), 10, 0))
    account = acc.observe(ev)
    assert account.miss == {"prompt_change": 1 + len(doc), "new": 2}
    brk = account.prefix_break
    assert brk is not None and brk["offset"] == 10 and brk["reference"] == "session"
    assert brk["changed"] == {"expected": "'50'", "got": "'51'", "resumes": 11, "realigned": len(doc)}


def test_a_new_task_in_a_new_run_is_new_not_a_change() -> None:
    ledger = SessionLedger()
    acc = StepAccounting(ledger)
    head = list(range(400))
    step(acc, head + [60, 61, 5, 6, 7], [70], Served(405, 0, 0))
    ledger.expect(0, ())
    tail = list(range(2000, 2020))  # the chat template's fixed close after every task
    step(acc, head + [60, 61] + tail, [1], Served(402, 0, 0))
    ledger.expect(0, ())
    run3 = head + [90, 91, 92] + tail
    ev = StepEvent(0, run3, [1], run3, [1], Served(len(run3), 400, 0))
    account = acc.observe(ev)
    assert account.prefix_break is None  # a short fixed close realigning is not a change
    assert account.miss == {"new": 3 + len(tail)}


def test_a_changing_span_inside_a_branch_is_shown() -> None:
    """The per-turn header case (a date near the start, every turn): the break shows the span."""
    acc = StepAccounting(SessionLedger())
    body = list(range(100, 160))
    p1 = [1, 2, 3, 901] + body
    step(acc, p1, [7, 8], Served(len(p1), 0, 0))
    p2 = [1, 2, 3, 902, 903] + body + [7, 8, 9]
    ev = StepEvent(0, p2, [5], p2, [5], Served(len(p2), 3, 0))
    account = acc.observe(ev)
    brk = account.prefix_break
    assert brk is not None and brk["reference"] == "branch" and brk["offset"] == 3
    assert brk["changed"] == {"expected": "'901'", "got": "'902 903'", "resumes": 5, "realigned": 62}
    assert account.miss == {"prompt_change": len(p1) + 2 - 3, "new": len(p2) - len(p1) - 2}


def test_the_same_offset_on_every_step_is_named() -> None:
    from agent.trace_cli import cause_sentence

    changed = {"expected": "'Mon'", "got": "'Tue'", "resumes": 5, "realigned": 900}
    brk = {"offset": 4, "unit": "tokens", "piece": "system message line 1", "changed": changed}
    records = [_record(i, {"prompt_change": 900, "new": 5}, brk) for i in (1, 2, 3)]
    sentence = cause_sentence(records)
    assert "system message line 1 changed ('Mon' -> 'Tue', 900 tokens after it unchanged)" in sentence
    assert "the same offset (4) changed on every one of these 3 steps" in sentence
