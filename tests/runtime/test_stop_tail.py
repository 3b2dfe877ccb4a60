"""scheduler.stop_tail: how much of a running text's end a stream holds back for a stop string."""

from __future__ import annotations

import random

from runtime.engine.scheduler import STOP_TAIL_TRIES, stop_tail


def _exact(text: str, stop: str) -> int:
    return max((k for k in range(1, len(stop)) if text.endswith(stop[:k])), default=0)


def test_the_longest_proper_prefix_at_the_end():
    assert stop_tail("Thought: done\nObs", "\nObservation:") == 4
    assert stop_tail("abc", "abc") == 0  # the whole stop is a match, found by the stop search
    assert stop_tail("xyz", "q") == 0
    assert stop_tail("aa", "aab") == 2
    assert stop_tail("a", "aaaa") == 1  # the text is shorter than the stop


def test_equals_the_definition_on_short_texts():
    rng = random.Random(0)
    for _ in range(20000):
        text = "".join(rng.choice("ab") for _ in range(rng.randint(0, 12)))
        stop = "".join(rng.choice("ab") for _ in range(rng.randint(1, 9)))
        assert stop_tail(text, stop) == _exact(text, stop), (text, stop)


def test_past_its_tries_it_holds_back_more_never_less():
    stop = "ab" * 40 + "c"
    text = "z" + "ab" * 30 + "a"  # many places where the stop could start; only the longest is real
    rng = random.Random(1)
    for _ in range(2000):
        noisy = "".join(rng.choice("abz") for _ in range(60)) + rng.choice(["a", "ab", "aba"])
        assert stop_tail(noisy, stop) >= _exact(noisy, stop)
    assert stop_tail(text, stop) == _exact(text, stop) == 61  # the first place tried is the longest
    tries = "".join(f"{'ab' * 5}x" for _ in range(STOP_TAIL_TRIES + 2)) + "ab"  # only "ab" is a real start
    assert stop_tail(tries, "ab" * 5 + "c") >= _exact(tries, "ab" * 5 + "c") == 2
